package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/internal/jsonlimit"
)

// The JSON admin API beside the pages: the same service calls, the same JSON as `oncegate … -o json`
// (docs/console.md lists the routes). A script sends an operator token as "Authorization: Bearer …"; a
// browser's session cookie works too. Errors are RFC 9457 problem details.

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Field  string `json:"field,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (s *Server) apiFail(w http.ResponseWriter, r *http.Request, err error) {
	st := statusOf(err)
	setRetryAfter(w, err)
	if st == http.StatusInternalServerError {
		s.log.Error("console api: request failed", "path", r.URL.Path, "err", err)
	}
	p := problem{Type: "about:blank", Title: http.StatusText(st), Status: st, Detail: err.Error()}
	var ie *admin.InvalidError
	if errors.As(err, &ie) {
		p.Field = ie.Field
		if ie.Field == strings.ToUpper(ie.Field) && !strings.Contains(ie.Field, "_") {
			// The service names a positional argument as the CLI's usage writes it (TYPE, DESTINATION, ID);
			// here it is the body's member of that name.
			p.Field = strings.ToLower(ie.Field)
		}
	}
	if st == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="oncegate console"`)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(st)
	_ = json.NewEncoder(w).Encode(p)
}

// api runs h for an authenticated operator and writes its value as JSON, or its error as a problem.
func (s *Server) api(mutates bool, h func(r *http.Request, a admin.Actor) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, err := s.actor(r)
		if err != nil {
			s.apiFail(w, r, err)
			return
		}
		if mutates && s.cfg.ReadOnly {
			s.apiFail(w, r, errReadOnly)
			return
		}
		v, err := h(r, a)
		if err != nil {
			var be *admin.BulkError
			if errors.As(err, &be) {
				writeJSON(w, http.StatusMultiStatus, map[string]any{"result": be.Result, "error": be.Error()})
				return
			}
			s.apiFail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})
}

var errReadOnly = &readOnlyError{}

type readOnlyError struct{}

func (*readOnlyError) Error() string {
	return "the console runs read-only (--read-only): nothing can be changed through it"
}
func (*readOnlyError) Is(target error) bool { return target == admin.ErrForbidden }

// actionBody is the JSON body of a change.
type actionBody struct {
	Tenant string   `json:"tenant"`
	Key    string   `json:"key"`
	As     string   `json:"as"`
	Reason string   `json:"reason"`
	Queue  string   `json:"queue"`
	Type   string   `json:"type"`
	IDs    []string `json:"ids"`
	// Destination is for destinations/resume: the receiver's URL.
	Destination string `json:"destination"`
	// Job is for job/enqueue: {"queue", "job": {"id", "kind", "payload", "max_attempts"}, "delay", "reason"}.
	Job   *admin.NewJob `json:"job"`
	Delay string        `json:"delay"`
	// Filter and DryRun are for retry-matching: without dry_run false, nothing changes.
	Filter *admin.EffectFilter `json:"filter"`
	DryRun *bool               `json:"dry_run"`
}

// actionMembers are the members each change reads from its body: actionBody holds every change's, and a
// member of another change's was taken and ignored, so that `{"tenant": "alpha"}` to destinations/resume
// lifted every tenant's pause, and to types/pause paused the type for everyone (an outside test).
var actionMembers = map[string][]string{
	"effect/reveal":          {"tenant", "key"},
	"job/reveal":             {"queue", "ids"},
	"effect/retry":           {"tenant", "key", "reason"},
	"effect/resolve":         {"tenant", "key", "as", "reason"},
	"effects/retry-matching": {"filter", "dry_run", "reason"},
	"types/pause":            {"type", "reason"},
	"types/resume":           {"type", "reason"},
	"destinations/resume":    {"type", "destination", "reason"},
	"queues/pause":           {"queue", "reason"},
	"queues/resume":          {"queue", "reason"},
	"job/enqueue":            {"queue", "job", "delay", "reason"},
	"dead/requeue":           {"queue", "ids", "reason"},
	"dead/purge":             {"queue", "ids", "reason"},
}

// nestedMembers are the members of the objects a body holds, by the body's member: those of admin.EffectFilter
// and admin.NewJob, as their JSON names them.
var nestedMembers = map[string][]string{
	"filter": jsonMembers(reflect.TypeFor[admin.EffectFilter]()),
	"job":    jsonMembers(reflect.TypeFor[admin.NewJob]()),
}

// jsonMembers lists the JSON names of a struct's fields.
func jsonMembers(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}

// readBody reads a change's body, refusing a member that is not one of members, naming it and them.
func readBody(r *http.Request, members []string) (actionBody, error) {
	var b actionBody
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return b, &admin.InvalidError{Field: "body", Reason: "cannot be read: " + err.Error()}
	}
	// Go's decoder turns bytes that are not UTF-8, and lone surrogate escapes, into U+FFFD without a word:
	// a type or a reason would be stored as something the operator never sent. Such a body is refused, as a
	// duplicate member is (which the decoder would settle by keeping the last).
	if !utf8.Valid(raw) {
		return b, &admin.InvalidError{Field: "body", Reason: "not valid UTF-8"}
	}
	if err := jsonlimit.Check(raw, jsonlimit.Limits{}); err != nil {
		var le *jsonlimit.Error
		if errors.As(err, &le) && le.Path != "" {
			return b, &admin.InvalidError{Field: le.Path, Reason: le.Reason}
		}
		return b, &admin.InvalidError{Field: "body", Reason: "want a JSON object: " + strings.TrimPrefix(err.Error(), "jsonlimit: ")}
	}
	// The change's own members first, so that one it does not take is named as such.
	var present map[string]json.RawMessage
	if err := json.Unmarshal(raw, &present); err != nil || present == nil {
		return b, &admin.InvalidError{Field: "body", Reason: "want a JSON object, such as {\"reason\": …}"}
	}
	for _, k := range slices.Sorted(maps.Keys(present)) {
		if !slices.Contains(members, k) {
			return b, &admin.InvalidError{Field: k, Reason: "not a member of this change's body: its members are " +
				strings.Join(members, ", ")}
		}
	}
	// And the members of its objects (a filter's, a job's), named by their path.
	for _, name := range slices.Sorted(maps.Keys(nestedMembers)) {
		var inner map[string]json.RawMessage
		if json.Unmarshal(present[name], &inner) != nil {
			continue // not an object: the decoder below says so
		}
		for _, k := range slices.Sorted(maps.Keys(inner)) {
			if !slices.Contains(nestedMembers[name], k) {
				return b, &admin.InvalidError{Field: name + "." + k, Reason: "not a member of " + name + ": its members are " +
					strings.Join(nestedMembers[name], ", ")}
			}
		}
		if name == "filter" && inner["since"] != nil {
			var t time.Time
			if err := json.Unmarshal(inner["since"], &t); err != nil {
				return b, &admin.InvalidError{Field: "filter.since", Reason: "want an RFC 3339 time, such as 2026-12-01T00:00:00Z"}
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		// Name the member at fault, as the gateway's API does: a value of the wrong type ("dry_run": "no",
		// filter.status: 5, by its path), or a member of an object deeper than the ones checked above.
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typ) && typ.Field != "":
			return b, &admin.InvalidError{Field: typ.Field, Reason: "a JSON " + typ.Value + " is not what it takes " +
				"(docs/console.md)"}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return b, &admin.InvalidError{Field: f, Reason: "not a member of its object (docs/console.md lists each body's)"}
		}
		return b, &admin.InvalidError{Field: "body", Reason: "want a JSON object: " + err.Error()}
	}
	return b, nil
}

// idsMember names the service's ID (the CLI's argument) as the body's member that holds them, ids.
func idsMember(err error) error {
	var ie *admin.InvalidError
	if errors.As(err, &ie) && ie.Field == "ID" {
		return &admin.InvalidError{Field: "ids", Reason: ie.Reason}
	}
	return err
}

// onlyParams refuses a query string with a parameter not in names, naming it and them.
func onlyParams(v url.Values, names ...string) error {
	for k := range v {
		if !slices.Contains(names, k) {
			if len(names) == 0 {
				return &admin.InvalidError{Field: k, Reason: "not a parameter here: this route takes none"}
			}
			return &admin.InvalidError{Field: k, Reason: "not a parameter here: the parameters are " +
				strings.Join(names, ", ")}
		}
	}
	return nil
}

// fleetFilter reads ?all=true, which lists the gateways gone for over an hour too.
func fleetFilter(r *http.Request) (admin.FleetFilter, error) {
	v := r.URL.Query().Get("all")
	if v == "" {
		return admin.FleetFilter{}, nil
	}
	all, err := strconv.ParseBool(v)
	if err != nil {
		return admin.FleetFilter{}, &admin.InvalidError{Field: "all", Reason: "want true or false"}
	}
	return admin.FleetFilter{All: all}, nil
}

func pageOf(r *http.Request) (admin.Page, error) {
	p := admin.Page{Cursor: r.URL.Query().Get("cursor")}
	if r.URL.Query().Has("limit") {
		// 0 is not "the default" here: a limit that is sent is 1 to MaxLimit, as the CLI's --limit.
		n, err := strconv.Atoi(r.URL.Query().Get("limit"))
		if err != nil || n < 1 || n > admin.MaxLimit {
			return p, &admin.InvalidError{Field: "limit", Reason: fmt.Sprintf("want a number from 1 to %d", admin.MaxLimit)}
		}
		p.Limit = n
	}
	return p, nil
}

func (s *Server) apiRoutes(mux *http.ServeMux) {
	// get serves a read that takes the query parameters params, each at most once: a misspelt one
	// (?stauts=dead) would widen a listing without a word, and of one sent twice, which counts is a guess.
	get := func(pattern string, params []string, h func(r *http.Request, a admin.Actor) (any, error)) {
		mux.Handle("GET /api/v1/"+pattern, s.api(false, func(r *http.Request, a admin.Actor) (any, error) {
			q := r.URL.Query()
			if q.Has("reveal") && (pattern == "effect" || pattern == "job") {
				// A GET changes nothing, and a reveal is audited: a link or an <img> on any page the
				// operator visits would otherwise write reveals in the operator's name.
				return nil, &admin.InvalidError{Field: "reveal", Reason: "a reveal is audited, so it is a POST: " +
					"POST /api/v1/" + pattern + "/reveal (docs/console.md)"}
			}
			if err := onlyParams(q, params...); err != nil {
				return nil, err
			}
			for _, name := range params {
				if n := len(q[name]); n > 1 {
					return nil, &admin.InvalidError{Field: name, Reason: fmt.Sprintf("sent %d times; send it once", n)}
				}
			}
			return h(r, a)
		}))
	}
	postAs := func(mutates bool, pattern string, h func(r *http.Request, a admin.Actor, b actionBody) (any, error)) {
		members, ok := actionMembers[pattern]
		if !ok {
			panic("console: no actionMembers for " + pattern)
		}
		mux.Handle("POST /api/v1/"+pattern, s.api(mutates, func(r *http.Request, a admin.Actor) (any, error) {
			b, err := readBody(r, members)
			if err != nil {
				return nil, err
			}
			return h(r, a, b)
		}))
	}
	post := func(pattern string, h func(r *http.Request, a admin.Actor, b actionBody) (any, error)) {
		postAs(true, pattern, h)
	}
	get("whoami", nil, func(r *http.Request, a admin.Actor) (any, error) { return a, nil })
	get("overview", nil, func(r *http.Request, a admin.Actor) (any, error) { return s.adm.EffectsOverview(r.Context(), a) })
	get("effects", []string{"tenant", "type", "status", "key_prefix", "since", "job", "search", "trace_id", "limit",
		"cursor"}, func(r *http.Request, a admin.Actor) (any, error) {
		f, err := effectFilter(r.URL.Query())
		if err != nil {
			return nil, err
		}
		p, err := pageOf(r)
		if err != nil {
			return nil, err
		}
		if t := r.URL.Query().Get("trace_id"); t != "" {
			es, err := s.adm.EffectsByTrace(r.Context(), a, t, admin.MaxLimit)
			return &admin.EffectPage{Effects: es}, err
		}
		return s.adm.Effects(r.Context(), a, f, p)
	})
	get("effect", []string{"tenant", "key"}, func(r *http.Request, a admin.Actor) (any, error) {
		return s.adm.Effect(r.Context(), a, r.URL.Query().Get("tenant"), r.URL.Query().Get("key"))
	})
	// A reveal changes nothing but the audit log, so --read-only allows it, as the page's Reveal.
	postAs(false, "effect/reveal", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return s.adm.RevealEffect(r.Context(), a, b.Tenant, b.Key)
	})
	postAs(false, "job/reveal", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		if len(b.IDs) != 1 {
			return nil, &admin.InvalidError{Field: "ids", Reason: "name the one job to reveal"}
		}
		return s.adm.RevealJob(r.Context(), a, b.Queue, b.IDs[0])
	})
	post("effect/retry", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return s.adm.RetryEffect(r.Context(), a, b.Tenant, b.Key, b.Reason)
	})
	post("effect/resolve", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return s.adm.ResolveEffect(r.Context(), a, b.Tenant, b.Key, b.As, b.Reason)
	})
	post("effects/retry-matching", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		var f admin.EffectFilter
		if b.Filter != nil {
			f = *b.Filter
		}
		// The CLI's -o json of `effect retry --all-matching`, field for field.
		type answer struct {
			Action string             `json:"action"`
			DryRun bool               `json:"dry_run"`
			Filter admin.EffectFilter `json:"filter"`
			admin.BulkResult
		}
		if b.DryRun == nil || *b.DryRun {
			n, err := s.adm.CountRetryable(r.Context(), a, f)
			return answer{Action: "effect.retry-matching", DryRun: true, Filter: f,
				BulkResult: admin.BulkResult{Matched: n}}, err
		}
		// A bulk retry may outlast RequestTimeout: it bounds each batch itself, and goes on, batch by
		// audited batch, if the client hangs up.
		res, err := s.adm.RetryEffects(context.WithoutCancel(r.Context()), a, f, b.Reason, nil)
		return answer{Action: "effect.retry-matching", Filter: f, BulkResult: res}, err
	})
	get("types", nil, func(r *http.Request, a admin.Actor) (any, error) { return s.adm.PausedTypes(r.Context(), a) })
	post("types/pause", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return map[string]string{"paused": b.Type}, s.adm.PauseType(r.Context(), a, b.Type, b.Reason)
	})
	post("types/resume", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return map[string]string{"resumed": b.Type}, s.adm.ResumeType(r.Context(), a, b.Type, b.Reason)
	})
	get("queues", nil, func(r *http.Request, a admin.Actor) (any, error) { return s.adm.Queues(r.Context(), a) })
	get("destinations", nil, func(r *http.Request, a admin.Actor) (any, error) { return s.adm.DestinationRates(r.Context(), a) })
	get("tenants", nil, func(r *http.Request, a admin.Actor) (any, error) { return s.adm.TenantRates(r.Context(), a) })
	post("destinations/resume", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return s.adm.ResumeDestination(r.Context(), a, b.Type, b.Destination, b.Reason)
	})
	post("queues/pause", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return map[string]string{"paused": b.Queue}, s.adm.PauseQueue(r.Context(), a, b.Queue, b.Reason)
	})
	post("queues/resume", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		return map[string]string{"resumed": b.Queue}, s.adm.ResumeQueue(r.Context(), a, b.Queue, b.Reason)
	})
	get("jobs", []string{"queue", "state", "limit", "cursor"}, func(r *http.Request, a admin.Actor) (any, error) {
		p, err := pageOf(r)
		if err != nil {
			return nil, err
		}
		return s.adm.Jobs(r.Context(), a, r.URL.Query().Get("queue"), r.URL.Query().Get("state"), p)
	})
	get("job", []string{"queue", "id"}, func(r *http.Request, a admin.Actor) (any, error) {
		return s.adm.Job(r.Context(), a, r.URL.Query().Get("queue"), r.URL.Query().Get("id"))
	})
	post("job/enqueue", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		if b.Job == nil {
			return nil, &admin.InvalidError{Field: "job", Reason: `required: {"kind": …, "payload": …}`}
		}
		nj := *b.Job
		if b.Delay != "" {
			d, err := time.ParseDuration(b.Delay)
			if err != nil {
				return nil, &admin.InvalidError{Field: "delay", Reason: "want a duration such as 30s or 5m"}
			}
			nj.Delay = d
		}
		res, err := s.adm.EnqueueJob(r.Context(), a, b.Queue, nj, b.Reason)
		// The service names the job's fields bare (the CLI's flags); here they are the job object's members.
		var ie *admin.InvalidError
		if errors.As(err, &ie) && slices.Contains(nestedMembers["job"], ie.Field) {
			err = &admin.InvalidError{Field: "job." + ie.Field, Reason: ie.Reason}
		}
		return res, err
	})
	post("dead/requeue", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		res, err := s.adm.RequeueDead(r.Context(), a, b.Queue, b.IDs, b.Reason)
		return res, idsMember(err)
	})
	post("dead/purge", func(r *http.Request, a admin.Actor, b actionBody) (any, error) {
		res, err := s.adm.PurgeDead(r.Context(), a, b.Queue, b.IDs, b.Reason)
		return res, idsMember(err)
	})
	get("workers", []string{"queue"}, func(r *http.Request, a admin.Actor) (any, error) {
		return s.adm.Workers(r.Context(), a, r.URL.Query().Get("queue"))
	})
	get("gateways", []string{"all"}, func(r *http.Request, a admin.Actor) (any, error) {
		f, err := fleetFilter(r)
		if err != nil {
			return nil, err
		}
		return s.adm.Gateways(r.Context(), a, f)
	})
	get("breakers", []string{"all"}, func(r *http.Request, a admin.Actor) (any, error) {
		f, err := fleetFilter(r)
		if err != nil {
			return nil, err
		}
		return s.adm.Breakers(r.Context(), a, f)
	})
	get("audit", []string{"actor", "action", "since", "limit", "cursor"}, func(r *http.Request, a admin.Actor) (any, error) {
		p, err := pageOf(r)
		if err != nil {
			return nil, err
		}
		since, err := parseSince(r.URL.Query().Get("since"))
		if err != nil {
			return nil, err
		}
		return s.adm.AuditLog(r.Context(), a, admin.AuditFilter{Actor: r.URL.Query().Get("actor"),
			Action: r.URL.Query().Get("action"), Since: since}, p)
	})
	mux.Handle("/api/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.apiFail(w, r, &admin.NotFoundError{What: "API route " + r.Method + " " + r.URL.Path})
	}))
}
