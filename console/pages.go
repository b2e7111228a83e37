package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/queue"
)

// ---- home

type queueView struct {
	admin.Queue
	Workers []admin.Worker
}

func liveWorkers(qs []queueView) int {
	n := 0
	for _, q := range qs {
		n += len(q.Workers)
	}
	return n
}

type homeData struct {
	Queues      []queueView
	QueuesError string
	Overview    *admin.Overview
	Gateways    []admin.Gateway
	// FoldedGateways counts the gateways gone for over an hour, left out of Gateways and Breakers.
	FoldedGateways int
	Breakers       []breakerGroup
	DeadJobs       int64
}

func (s *Server) homeData(r *http.Request, a admin.Actor) (homeData, error) {
	ctx := r.Context()
	var d homeData
	qs, err := s.adm.Queues(ctx, a)
	switch {
	case errors.Is(err, admin.ErrUnavailable):
		d.QueuesError = err.Error()
	case err != nil:
		return d, err
	}
	for _, q := range qs {
		v := queueView{Queue: q}
		if q.Workers > 0 {
			ws, err := s.adm.Workers(ctx, a, q.Name)
			if err != nil {
				return d, err
			}
			for _, w := range ws {
				if w.Alive {
					v.Workers = append(v.Workers, w)
				}
			}
		}
		d.DeadJobs += q.Counts[queue.StateDead]
		d.Queues = append(d.Queues, v)
	}
	if d.Overview, err = s.adm.EffectsOverview(ctx, a); err != nil {
		return d, err
	}
	fleet, err := s.adm.Gateways(ctx, a, admin.FleetFilter{})
	if err != nil {
		return d, err
	}
	d.Gateways, d.FoldedGateways = fleet.Gateways, fleet.Folded
	d.Breakers = breakerGroups(fleet.Gateways)
	return d, nil
}

func (s *Server) home(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	d, err := s.homeData(r, a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	s.render(w, r, http.StatusOK, "home", s.frame(a, "Home", "home", d))
}

func (s *Server) homeFragment(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	d, err := s.homeData(r, a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	s.renderBlock(w, r, http.StatusOK, "home", "body", s.frame(a, "Home", "home", d))
}

// ---- effects

type effectsData struct {
	Filter admin.EffectFilter
	Since  string
	Search string
	Cursor string
	Page   *admin.EffectPage
	Found  string // what the search box matched: "job", "trace", "key prefix"
	// Jobs are the queue jobs whose ID is the search, one per queue that holds one.
	Jobs  []jobRef
	Query string // the filters as a query string, for the fragment, the next page and bulk actions
	// MatchQuery is the filter the list shows as a query string retry-matching reads (a search's key prefix
	// or job as key_prefix or job); empty when the list is not a filter's (a trace's effects).
	MatchQuery string
	Status     []effect.Status
	Limit      int
	Message    string
}

// parseSince reads a "since" field: a duration back from now (1h, 30m), an RFC 3339 time or a
// datetime-local value.
func parseSince(v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, &admin.InvalidError{Field: "since", Reason: fmt.Sprintf("%q: want a duration back from now "+
		"(1h, 30m) or a time (2026-01-02T15:04)", v)}
}

func effectFilter(v url.Values) (admin.EffectFilter, error) {
	f := admin.EffectFilter{Tenant: strings.TrimSpace(v.Get("tenant")), Type: strings.TrimSpace(v.Get("type")),
		Status: effect.Status(v.Get("status")), KeyPrefix: v.Get("key_prefix"), JobID: strings.TrimSpace(v.Get("job")),
		Search: strings.TrimSpace(v.Get("search"))}
	var err error
	f.Since, err = parseSince(v.Get("since"))
	return f, err
}

// matchQuery is f as the query string effectFilter reads back, with since as the operator typed it.
func matchQuery(f admin.EffectFilter, since string) string {
	v := url.Values{}
	for k, x := range map[string]string{"tenant": f.Tenant, "type": f.Type, "status": string(f.Status),
		"key_prefix": f.KeyPrefix, "job": f.JobID, "search": f.Search} {
		if x != "" {
			v.Set(k, x)
		}
	}
	if !f.Since.IsZero() {
		v.Set("since", since)
	}
	return v.Encode()
}

// unfiltered: f names no effect in particular, and a retry of all matching would be one of everything.
func unfiltered(f admin.EffectFilter) bool {
	return f.Tenant == "" && f.Type == "" && f.Status == "" && f.KeyPrefix == "" && f.JobID == "" && f.Search == "" &&
		f.Since.IsZero()
}

// filterQuery is the filter part of a listing's query string, for links that keep it.
func filterQuery(v url.Values) string {
	out := url.Values{}
	for _, k := range []string{"tenant", "type", "status", "key_prefix", "since", "job", "search", "q"} {
		if x := v.Get(k); x != "" {
			out.Set(k, x)
		}
	}
	return out.Encode()
}

func (s *Server) effectsData(r *http.Request, a admin.Actor) (effectsData, string, error) {
	v := r.URL.Query()
	d := effectsData{Since: v.Get("since"), Search: strings.TrimSpace(v.Get("q")), Cursor: v.Get("cursor"),
		Status: effect.Statuses(), Query: filterQuery(v)}
	f, err := effectFilter(v)
	if err != nil {
		return d, "", err
	}
	d.Filter = f
	if d.Search != "" && d.Cursor == "" {
		if d.Jobs, err = s.jobsNamed(r, a, d.Search); err != nil {
			return d, "", err
		}
		// One box for a key, a job ID, a trace id, a tag or a recipient: an exact key opens the effect; else
		// the job's effects; else the trace's; else those tagged or addressed so; else keys that start with it.
		det, err := s.adm.Effect(r.Context(), a, f.Tenant, d.Search)
		switch {
		case err == nil:
			return d, effectURL(det.Tenant, det.Key), nil
		case errors.Is(err, admin.ErrInvalid): // several tenants hold the key: list them
			d.Filter.KeyPrefix, d.Found = d.Search, "the key (held by several tenants)"
		case !errors.Is(err, admin.ErrNotFound):
			return d, "", err
		}
		if d.Found == "" {
			jf := f
			jf.JobID = d.Search
			p, err := s.adm.Effects(r.Context(), a, jf, admin.Page{Limit: admin.DefaultLimit})
			if err != nil {
				return d, "", err
			}
			if len(p.Effects) > 0 {
				d.Filter, d.Page, d.Found = jf, p, "job "+d.Search
				// The next pages are the job's effects, not a search again.
				nv := url.Values{}
				for k, vs := range v {
					nv[k] = vs
				}
				nv.Del("q")
				nv.Set("job", d.Search)
				d.Query = filterQuery(nv)
				d.MatchQuery = matchQuery(d.Filter, d.Since)
				return d, "", nil
			}
			byTrace, err := s.adm.EffectsByTrace(r.Context(), a, d.Search, admin.DefaultLimit)
			if err != nil {
				return d, "", err
			}
			if len(byTrace) > 0 {
				d.Page, d.Found = &admin.EffectPage{Effects: byTrace}, "trace "+d.Search
				return d, "", nil
			}
			sf := f
			sf.Search = d.Search
			p, err = s.adm.Effects(r.Context(), a, sf, admin.Page{Limit: admin.DefaultLimit})
			if err != nil {
				return d, "", err
			}
			if len(p.Effects) > 0 {
				d.Filter, d.Page, d.Found = sf, p, "tag or recipient "+strconv.Quote(d.Search)
				nv := url.Values{}
				for k, vs := range v {
					nv[k] = vs
				}
				nv.Del("q")
				nv.Set("search", d.Search)
				d.Query = filterQuery(nv)
				d.MatchQuery = matchQuery(d.Filter, d.Since)
				return d, "", nil
			}
			d.Filter.KeyPrefix, d.Found = d.Search, "keys starting with "+strconv.Quote(d.Search)
		}
	}
	if d.Search != "" && d.Filter.KeyPrefix == "" {
		d.Filter.KeyPrefix = d.Search
	}
	d.MatchQuery = matchQuery(d.Filter, d.Since)
	d.Page, err = s.adm.Effects(r.Context(), a, d.Filter, admin.Page{Limit: admin.DefaultLimit, Cursor: d.Cursor})
	return d, "", err
}

// jobRef is a queue job the search box found.
type jobRef struct {
	Queue string
	ID    string
	State queue.JobState
}

// jobsNamed finds the jobs with this ID in every registered queue: a few O(1) reads per queue. Without Redis,
// or with no queue, none.
func (s *Server) jobsNamed(r *http.Request, a admin.Actor, id string) ([]jobRef, error) {
	qs, err := s.adm.Queues(r.Context(), a)
	if errors.Is(err, admin.ErrUnavailable) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []jobRef
	for _, q := range qs {
		j, err := s.adm.Job(r.Context(), a, q.Name, id)
		switch {
		case errors.Is(err, admin.ErrNotFound):
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, jobRef{Queue: q.Name, ID: j.ID, State: j.State})
	}
	return out, nil
}

func (s *Server) effects(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	d, redirect, err := s.effectsData(r, a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	if redirect != "" {
		http.Redirect(w, r, redirect, http.StatusSeeOther)
		return
	}
	p := s.frame(a, "Effects", "effects", d)
	p.Notice = notice(r)
	s.render(w, r, http.StatusOK, "effects", p)
}

func (s *Server) effectsFragment(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	d, _, err := s.effectsData(r, a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	s.renderBlock(w, r, http.StatusOK, "effects", "rows", s.frame(a, "Effects", "effects", d))
}

// notices are the messages a redirect after a change may show, by code (never text from the query).
var notices = map[string]string{
	"retried":  "Sent back to pending: a gateway delivers it again.",
	"resolved": "Resolved: the resolution and your reason are on the effect and in the audit log.",
	"requeued": "Requeued: the jobs are ready again.",
	"purged":   "Purged: the jobs are gone for good.",
	"paused":   "Paused.",
	"resumed":  "Resumed.",
	"resumed-destination": "Resumed: every gateway calls the destination again, and its rows waiting for a retry " +
		"are due now.",
	"enqueued": "Enqueued: the job is in the queue and in the audit log.",
	"duplicate": "Nothing added: a job with this ID is in the queue already, or completed within its dedup " +
		"window. This is that job.",
}

func notice(r *http.Request) string {
	msg := notices[r.URL.Query().Get("done")]
	if n := r.URL.Query().Get("n"); msg != "" && n != "" {
		if k, err := strconv.Atoi(n); err == nil {
			msg = fmt.Sprintf("%d: %s", k, msg)
		}
	}
	return msg
}

type effectData struct {
	*admin.EffectDetail
	Payload   string
	CanRetry  bool
	IsUnknown bool
}

func (s *Server) effectDetail(r *http.Request, a admin.Actor, tenant, key string, reveal bool) (effectData, error) {
	get := s.adm.Effect
	if reveal {
		get = s.adm.RevealEffect
	}
	det, err := get(r.Context(), a, tenant, key)
	if err != nil {
		return effectData{}, err
	}
	return effectData{EffectDetail: det, Payload: prettyJSON(det.Payload), CanRetry: det.Status.Retryable() && !det.BodyExpired,
		IsUnknown: det.Status == effect.StatusUnknown}, nil
}

func (s *Server) effect(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	v := r.URL.Query()
	d, err := s.effectDetail(r, a, v.Get("tenant"), v.Get("key"), false)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	p := s.frame(a, "Effect "+d.Key, "effects", d)
	p.Notice = notice(r)
	s.render(w, r, http.StatusOK, "effect", p)
}

func (s *Server) reveal(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	d, err := s.effectDetail(r, a, r.PostFormValue("tenant"), r.PostFormValue("key"), true)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	s.render(w, r, http.StatusOK, "effect", s.frame(a, "Effect "+d.Key, "effects", d))
}

func (s *Server) retryEffect(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	e, err := s.adm.RetryEffect(r.Context(), a, r.PostFormValue("tenant"), r.PostFormValue("key"), r.PostFormValue("reason"))
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, effectURL(e.Tenant, e.Key)+"&done=retried", http.StatusSeeOther)
}

func (s *Server) resolveEffect(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	e, err := s.adm.ResolveEffect(r.Context(), a, r.PostFormValue("tenant"), r.PostFormValue("key"),
		r.PostFormValue("as"), r.PostFormValue("reason"))
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, effectURL(e.Tenant, e.Key)+"&done=resolved", http.StatusSeeOther)
}

// retrySelected retries the effects ticked on a page, one audited retry each; those in a state a retry does
// not apply to are counted and named, not fatal.
func (s *Server) retrySelected(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, a, &admin.InvalidError{Field: "form", Reason: err.Error()})
		return
	}
	sel := r.PostForm["sel"]
	if len(sel) == 0 {
		s.fail(w, r, a, &admin.InvalidError{Field: "selection", Reason: "tick at least one effect"})
		return
	}
	if len(sel) > admin.MaxLimit {
		s.fail(w, r, a, &admin.InvalidError{Field: "selection", Reason: fmt.Sprintf("at most %d at once", admin.MaxLimit)})
		return
	}
	reason := r.PostFormValue("reason")
	var done int
	var skipped []string
	wrongState := false
	for _, v := range sel {
		id, err := url.ParseQuery(v)
		if err != nil {
			s.fail(w, r, a, &admin.InvalidError{Field: "selection", Reason: err.Error()})
			return
		}
		_, err = s.adm.RetryEffect(r.Context(), a, id.Get("tenant"), id.Get("key"), reason)
		switch {
		case err == nil:
			done++
		case errors.Is(err, admin.ErrWrongState), errors.Is(err, admin.ErrNotFound):
			skipped = append(skipped, err.Error())
			wrongState = wrongState || errors.Is(err, admin.ErrWrongState)
		default:
			if done > 0 {
				err = fmt.Errorf("%w: retried %d of %d, then: %w", admin.ErrPartial, done, len(sel), err)
			}
			s.fail(w, r, a, err)
			return
		}
	}
	// None retried is not a partial success: it is the answer a retry of each alone gets (409, or 404 when
	// none exists), as from the API and the CLI.
	if len(skipped) > 0 && done == 0 {
		class := admin.ErrNotFound
		if wrongState {
			class = admin.ErrWrongState
		}
		s.fail(w, r, a, fmt.Errorf("%w: retried none of %d: %s", class, len(sel), strings.Join(skipped, "; ")))
		return
	}
	if len(skipped) > 0 {
		s.fail(w, r, a, fmt.Errorf("%w: retried %d of %d; not retried: %s", admin.ErrPartial, done, len(sel),
			strings.Join(skipped, "; ")))
		return
	}
	http.Redirect(w, r, "/effects?"+filterQuery(r.PostForm)+"&done=retried&n="+strconv.Itoa(done), http.StatusSeeOther)
}

type retryMatchingData struct {
	Filter admin.EffectFilter
	Query  string
	Count  int64
	// Unfiltered: no filter at all, which the service refuses to retry in bulk.
	Unfiltered bool
}

// retryMatchingPreview is the dry run: how many effects a retry of all matching would send back.
func (s *Server) retryMatchingPreview(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	f, err := effectFilter(r.URL.Query())
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	var n int64
	if !unfiltered(f) { // the service refuses to count a bulk retry of everything: the page says why instead
		if n, err = s.adm.CountRetryable(r.Context(), a, f); err != nil {
			s.fail(w, r, a, err)
			return
		}
	}
	s.render(w, r, http.StatusOK, "retry-matching", s.frame(a, "Retry all matching", "effects",
		retryMatchingData{Filter: f, Query: filterQuery(r.URL.Query()), Count: n, Unfiltered: unfiltered(f)}))
}

func (s *Server) retryMatching(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, a, &admin.InvalidError{Field: "form", Reason: err.Error()})
		return
	}
	f, err := effectFilter(r.PostForm)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	// The run starts after this answer, so a refusal of the service's would reach only the progress page:
	// the service's checks (role, reason, filter) run here first, while the operator still sees the form.
	reason := r.PostFormValue("reason")
	if err := s.adm.CheckRetryEffects(r.Context(), a, f, reason); err != nil {
		s.fail(w, r, a, err)
		return
	}
	id := s.startBulk(a, f, reason)
	http.Redirect(w, r, "/bulk/"+id, http.StatusSeeOther)
}

// ---- types

func (s *Server) pauseType(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if err := s.adm.PauseType(r.Context(), a, r.PostFormValue("type"), r.PostFormValue("reason")); err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, "/?done=paused", http.StatusSeeOther)
}

func (s *Server) resumeType(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if err := s.adm.ResumeType(r.Context(), a, r.PostFormValue("type"), r.PostFormValue("reason")); err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, "/?done=resumed", http.StatusSeeOther)
}

// ---- destinations

func (s *Server) destinations(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	ds, err := s.adm.DestinationRates(r.Context(), a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	ts, err := s.adm.TenantRates(r.Context(), a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	p := s.frame(a, "Destinations", "destinations", destinationsPage{ds, ts})
	p.Notice = notice(r)
	s.render(w, r, http.StatusOK, "destinations", p)
}

func (s *Server) resumeDestination(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if _, err := s.adm.ResumeDestination(r.Context(), a, r.PostFormValue("type"), r.PostFormValue("destination"),
		r.PostFormValue("reason")); err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, "/destinations?done=resumed-destination", http.StatusSeeOther)
}

// destinationsPage is what holds deliveries and requests back: each destination's limit, rate and pause, and
// each tenant's fleet-wide request bucket (issue 31).
type destinationsPage struct {
	Destinations []admin.DestinationRate
	Tenants      []admin.TenantRate
}

// ---- queues and jobs

func (s *Server) queues(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	qs, err := s.adm.Queues(r.Context(), a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	p := s.frame(a, "Queues", "queues", qs)
	p.Notice = notice(r)
	s.render(w, r, http.StatusOK, "queues", p)
}

func (s *Server) pauseQueue(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if err := s.adm.PauseQueue(r.Context(), a, r.PostFormValue("queue"), r.PostFormValue("reason")); err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, "/queues?done=paused", http.StatusSeeOther)
}

func (s *Server) resumeQueue(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	if err := s.adm.ResumeQueue(r.Context(), a, r.PostFormValue("queue"), r.PostFormValue("reason")); err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, "/queues?done=resumed", http.StatusSeeOther)
}

type queueData struct {
	Name   string
	State  string
	States []queue.JobState
	Cursor string
	Page   *admin.JobPage
	// Queue is the queue's summary (counts per state, pause), for the tabs and the header.
	Queue admin.Queue
}

func (s *Server) queueData(r *http.Request, a admin.Actor) (queueData, error) {
	v := r.URL.Query()
	d := queueData{Name: v.Get("name"), State: v.Get("state"), States: queue.JobStates(), Cursor: v.Get("cursor")}
	if d.State == "" {
		d.State = string(queue.StateReady)
	}
	var err error
	d.Page, err = s.adm.Jobs(r.Context(), a, d.Name, d.State, admin.Page{Limit: admin.DefaultLimit, Cursor: d.Cursor})
	if err != nil {
		return d, err
	}
	// Every queue's summary is a few O(1) commands each: reading them all to show this one is cheap.
	qs, err := s.adm.Queues(r.Context(), a)
	for _, q := range qs {
		if q.Name == d.Name {
			d.Queue = q
		}
	}
	return d, err
}

func (s *Server) queuePage(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	d, err := s.queueData(r, a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	p := s.frame(a, "Queue "+d.Name, "queues", d)
	p.Notice = notice(r)
	s.render(w, r, http.StatusOK, "queue", p)
}

func (s *Server) queueFragment(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	d, err := s.queueData(r, a)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	s.renderBlock(w, r, http.StatusOK, "queue", "rows", s.frame(a, "Queue "+d.Name, "queues", d))
}

// jobData is a job as its page shows it.
type jobData struct {
	*admin.JobDetail
	// Payload is the job's payload, indented.
	Payload string
}

// jobFor is the job, its payload redacted unless reveal (an operator's audited reveal).
func (s *Server) jobFor(r *http.Request, a admin.Actor, name, id string, reveal bool) (jobData, error) {
	get := s.adm.Job
	if reveal {
		get = s.adm.RevealJob
	}
	j, err := get(r.Context(), a, name, id)
	if err != nil {
		return jobData{}, err
	}
	return jobData{JobDetail: j, Payload: prettyJSON(json.RawMessage(j.Payload))}, nil
}

func (s *Server) revealJob(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	j, err := s.jobFor(r, a, r.PostFormValue("queue"), r.PostFormValue("id"), true)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	s.render(w, r, http.StatusOK, "job", s.frame(a, "Job "+j.ID, "queues", j))
}

func (s *Server) job(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	v := r.URL.Query()
	j, err := s.jobFor(r, a, v.Get("queue"), v.Get("id"), false)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	p := s.frame(a, "Job "+j.ID, "queues", j)
	p.Notice = notice(r)
	s.render(w, r, http.StatusOK, "job", p)
}

func (s *Server) deadAction(w http.ResponseWriter, r *http.Request, a admin.Actor, purge bool) {
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, a, &admin.InvalidError{Field: "form", Reason: err.Error()})
		return
	}
	name, ids, reason := r.PostFormValue("queue"), r.PostForm["id"], r.PostFormValue("reason")
	do, done := s.adm.RequeueDead, "requeued"
	if purge {
		do, done = s.adm.PurgeDead, "purged"
	}
	res, err := do(r.Context(), a, name, ids, reason)
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	http.Redirect(w, r, "/queue?"+url.Values{"name": {name}, "state": {"dead"}, "done": {done},
		"n": {strconv.FormatInt(res.Applied, 10)}}.Encode(), http.StatusSeeOther)
}

// enqueueJob is the queue page's form: the job goes in as a producer's would, audited as job.enqueue, and
// the page that follows is the new job's.
func (s *Server) enqueueJob(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	name := r.PostFormValue("queue")
	nj := admin.NewJob{ID: strings.TrimSpace(r.PostFormValue("id")), Kind: strings.TrimSpace(r.PostFormValue("kind")),
		Payload: []byte(r.PostFormValue("payload"))}
	if d := strings.TrimSpace(r.PostFormValue("delay")); d != "" {
		v, err := time.ParseDuration(d)
		if err != nil {
			s.fail(w, r, a, &admin.InvalidError{Field: "delay", Reason: "want a duration such as 30s or 5m"})
			return
		}
		nj.Delay = v
	}
	res, err := s.adm.EnqueueJob(r.Context(), a, name, nj, r.PostFormValue("reason"))
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	done := "enqueued"
	if res.Duplicate {
		done = "duplicate"
	}
	http.Redirect(w, r, link("/job", "queue", name, "id", res.ID, "done", done), http.StatusSeeOther)
}

func (s *Server) requeueDead(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	s.deadAction(w, r, a, false)
}

func (s *Server) purgeDead(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	s.deadAction(w, r, a, true)
}

// ---- audit

type auditData struct {
	Filter  admin.AuditFilter
	Actions []string
	Since   string
	Query   string
	Page    *admin.AuditPage
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request, a admin.Actor) {
	v := r.URL.Query()
	d := auditData{Filter: admin.AuditFilter{Actor: strings.TrimSpace(v.Get("actor")),
		Action: strings.TrimSpace(v.Get("action"))}, Actions: admin.AuditActions, Since: v.Get("since")}
	var err error
	if d.Filter.Since, err = parseSince(d.Since); err != nil {
		s.fail(w, r, a, err)
		return
	}
	q := url.Values{}
	for _, k := range []string{"actor", "action", "since"} {
		if x := v.Get(k); x != "" {
			q.Set(k, x)
		}
	}
	d.Query = q.Encode()
	d.Page, err = s.adm.AuditLog(r.Context(), a, d.Filter, admin.Page{Limit: admin.DefaultLimit, Cursor: v.Get("cursor")})
	if err != nil {
		s.fail(w, r, a, err)
		return
	}
	s.render(w, r, http.StatusOK, "audit", s.frame(a, "Audit log", "audit", d))
}
