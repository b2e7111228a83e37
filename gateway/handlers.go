package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gorilla/mux"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/jsonlimit"
	"github.com/oncegate/oncegate/providers"
)

type createRequest struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
	Wait    string          `json:"wait"`
	// Tags label the effect for an operator's search (effect.CheckTags); the Oncegate-Tags header does the
	// same for a client that cannot change the body.
	Tags []string `json:"tags"`
}

func (g *Gateway) createEffect(w http.ResponseWriter, r *http.Request) error {
	tenant := tenantOf(r)
	if _, err := query(r); err != nil { // its wait, type and payload go in the body
		return err
	}
	// application/json alone, as openapi.yaml lists it (parameters such as charset=utf-8 are fine): a +json
	// type is JSON that means something else (merge-patch+json is a patch), which this API does not take. JSON
	// is UTF-8 (RFC 8259 §8.1): a body said to be in another charset is refused as sent, not read as UTF-8.
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return refuse(probUnsupportedMedia, "", "send the request body as Content-Type: application/json")
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return refuse(probUnsupportedMedia, "", fmt.Sprintf("the body is said to be in charset %q: send JSON in UTF-8", cs))
	}
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		// Which one would count is a guess a proxy and the gateway could make differently: refuse both.
		return invalid("Idempotency-Key", "the header is sent more than once; send one key")
	}
	key, err := dedup.ParseKey(r.Header.Get("Idempotency-Key"))
	if err != nil {
		return invalid("Idempotency-Key", err.Error())
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(g.cfg.Limits.MaxBody)))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return refuse(probBodyTooLarge, "", fmt.Sprintf("the body is over the limit of %d bytes", g.cfg.Limits.MaxBody))
		}
		return invalid("", "could not read the request body")
	}
	req, field, err := decodeCreate(body)
	if err != nil {
		return invalid(field, err.Error())
	}
	if !g.allows(tenant, req.Type) {
		return g.typeNotAllowed(tenant, req.Type)
	}
	p, ok := g.providers.Get(req.Type)
	if !ok {
		return invalid("type", fmt.Sprintf("unknown effect type %q", req.Type))
	}
	if err := p.Validate(req.Payload); err != nil {
		var fe *providers.FieldError
		if errors.As(err, &fe) {
			return invalid(fe.Field, fe.Error())
		}
		return invalid("payload", err.Error())
	}
	wait, err := parseWait(req.Wait)
	if err != nil {
		return invalid("wait", err.Error())
	}

	if name, why := jobHeadersOnce(r); name != "" {
		return invalid(name, why)
	}
	jobID, epoch, err := jobHeaders(r)
	if err != nil {
		return invalid("Oncegate-Job-Epoch", err.Error())
	}
	tags, field, err := requestTags(r, req.Tags)
	if err != nil {
		return invalid(field, err.Error())
	}
	jobQueue, err := jobQueueHeader(r, jobID)
	if err != nil {
		return invalid("Oncegate-Job-Queue", err.Error())
	}
	jobCreated, err := jobCreatedHeader(r, jobID)
	if err != nil {
		return invalid("Oncegate-Job-Created", err.Error())
	}

	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.cfg.Timeouts.Database))
	defer cancel()
	e, replayed, err := g.store.Create(ctx, dedup.NewEffect{Tenant: tenant, Key: key, Type: req.Type, Payload: req.Payload,
		JobID: jobID, JobEpoch: epoch, JobQueue: jobQueue, JobCreated: jobCreated, Tags: tags, Terms: effect.SearchTerms(tags, providers.Recipients(p, req.Payload)),
		Destination: providers.Destination(p, req.Payload)})
	if err != nil {
		return about(err, key, req.Type)
	}
	if replayed {
		if err := g.durable(ctx); err != nil {
			return about(err, key, req.Type)
		}
	}
	span := trace.SpanFromContext(r.Context())
	span.SetAttributes(attribute.String("idempotency.key", key), attribute.Bool("idempotency.replayed", replayed),
		attribute.String("effect.type", e.Type), attribute.String("tenant", tenant))
	defer func() { span.SetAttributes(attribute.String("effect.status", string(e.Status))) }()
	if replayed {
		g.metrics.replays.WithLabelValues(e.Type).Inc()
		g.replays.Add(e.ID, epoch, time.Now())
		w.Header().Set("Idempotent-Replayed", "true")
	} else {
		g.metrics.effectsCreated.WithLabelValues(e.Type).Inc()
		g.announce(e, tenant, req.Payload)
	}
	if wait > 0 && !e.Status.Terminal() {
		var cut bool
		e, cut = g.waitTerminal(r.Context(), tenant, e, wait)
		waitCut(w, cut)
	}
	w.Header().Set("Location", effectPath(key))
	status := http.StatusAccepted
	if (replayed && e.Status.Terminal()) || (!replayed && e.Status == effect.StatusDelivered) {
		status = http.StatusOK
	}
	writeJSON(w, status, e)
	return nil
}

// requestTags are the effect's tags: the body's, or the Oncegate-Tags header's, not both (which would win is a
// guess). It returns the field at fault with its error.
func requestTags(r *http.Request, body []string) ([]string, string, error) {
	header := r.Header.Values("Oncegate-Tags")
	if len(header) > 0 && body != nil {
		return nil, "tags", errors.New("tags are sent both in the body and in the Oncegate-Tags header; send them once")
	}
	if len(header) > 0 {
		tags, err := effect.ParseTagsHeader(header)
		return tags, "Oncegate-Tags", err
	}
	return body, "tags", effect.CheckTags(body)
}

// jobHeaderNames are the headers that name a queue job's run: each is sent once, with a value, or not at all.
var jobHeaderNames = []string{"Oncegate-Job-Id", "Oncegate-Job-Epoch", "Oncegate-Job-Queue", "Oncegate-Job-Created"}

// jobHeadersOnce names a job header sent twice (whose first value would have counted: a fence raised under
// one queue while the effect named another) or sent empty (an empty queue was read as none), and why.
func jobHeadersOnce(r *http.Request) (string, string) {
	for _, name := range jobHeaderNames {
		switch vs := r.Header.Values(name); {
		case len(vs) > 1:
			return name, "is sent twice: send it once"
		case len(vs) == 1 && vs[0] == "":
			return name, "is empty: send it with a value, or leave it out"
		}
	}
	return "", ""
}

// jobHeaders reads Oncegate-Job-Id and Oncegate-Job-Epoch, which a worker sends to have its effects fenced
// by its job's lease epoch.
func jobHeaders(r *http.Request) (string, int64, error) {
	id := r.Header.Get("Oncegate-Job-Id")
	raw := r.Header.Get("Oncegate-Job-Epoch")
	if id == "" && raw == "" {
		return "", 0, nil
	}
	// Plain digits from 1, without sign or leading zero: ParseInt alone reads "+9" and "09" as 9, spellings
	// that another reader of the header (a proxy's rule, a log search) need not take for the same epoch.
	epoch, err := strconv.ParseInt(raw, 10, 64)
	plain := raw != "" && raw[0] >= '1' && raw[0] <= '9' && strings.Trim(raw, "0123456789") == ""
	if id == "" || len(id) > 512 || !utf8.ValidString(id) || err != nil || !plain {
		return "", 0, errors.New("Oncegate-Job-Id (UTF-8, at most 512 bytes) and Oncegate-Job-Epoch (decimal digits, " +
			"from 1, without sign or leading zero) go together")
	}
	return id, epoch, nil
}

// maxCreatedAhead is how far ahead of the gateway's clock Oncegate-Job-Created may be.
const maxCreatedAhead = time.Hour

// jobCreatedHeader reads Oncegate-Job-Created: when the job was enqueued, in unix milliseconds, which ranks a
// job enqueued again under its ID above the old one's leases (migration 00034). 0 when not sent.
func jobCreatedHeader(r *http.Request, jobID string) (int64, error) {
	raw := r.Header.Get("Oncegate-Job-Created")
	if raw == "" {
		return 0, nil
	}
	if jobID == "" {
		return 0, errors.New("is when a job was enqueued: send it with Oncegate-Job-Id and Oncegate-Job-Epoch")
	}
	ms, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || raw[0] < '1' || raw[0] > '9' || strings.Trim(raw, "0123456789") != "" {
		return 0, errors.New("unix milliseconds: decimal digits, without sign or leading zero")
	}
	// A creation ahead of every clock would rank this job above every run of its ID to come: each later job
	// under the ID would be refused until the fence is forgotten. An hour covers clocks apart.
	if ahead := time.Until(time.UnixMilli(ms)); ahead > maxCreatedAhead {
		return 0, fmt.Errorf("is %v ahead of this gateway's clock (at most %v): a job's creation is when Redis "+
			"took it (queue.Job.CreatedAt)", ahead.Round(time.Second), maxCreatedAhead)
	}
	return ms, nil
}

// jobQueueHeader reads Oncegate-Job-Queue: the queue of the job that Oncegate-Job-Id names, stored with the
// effect so that an operator finds the job without guessing its queue. It needs a job, and is a queue name
// as the queue package takes one.
func jobQueueHeader(r *http.Request, jobID string) (string, error) {
	q := r.Header.Get("Oncegate-Job-Queue")
	switch {
	case q == "":
		return "", nil
	case jobID == "":
		return "", errors.New("names the queue of a job: send it with Oncegate-Job-Id and Oncegate-Job-Epoch")
	case len(q) > 200 || !utf8.ValidString(q) || strings.ContainsAny(q, "{}") || strings.IndexFunc(q, unicode.IsControl) >= 0:
		return "", errors.New("a queue name is 1 to 200 bytes of UTF-8, without braces or control characters")
	}
	return q, nil
}

// decodeCreate parses the request body strictly and returns the field at fault with its error.
func decodeCreate(body []byte) (createRequest, string, error) {
	var req createRequest
	if !utf8.Valid(body) {
		return req, "", errors.New("the body is not valid UTF-8, which JSON requires")
	}
	if string(bytes.TrimSpace(body)) == "null" { // Go's decoder reads null into a struct as nothing at all
		return req, "", errors.New("the body is a JSON null, not an object with type and payload")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return req, "", fmt.Errorf("the body is not valid JSON: %v (at byte %d)", err, syn.Offset)
		case errors.As(err, &typ) && typ.Field == "":
			return req, "", fmt.Errorf("the body is a JSON %v, not an object with type and payload", typ.Value)
		case errors.As(err, &typ):
			return req, typ.Field, fmt.Errorf("%s has the wrong type: %v", typ.Field, typ.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return req, f, fmt.Errorf("unknown field %q: the body has type, payload, wait and tags", f)
		case errors.Is(err, io.EOF):
			return req, "", errors.New("the body is empty")
		default:
			return req, "", fmt.Errorf("the body is not valid JSON: %v", err)
		}
	}
	if dec.More() {
		return req, "", errors.New("the body has data after its JSON object")
	}
	if req.Type == "" {
		return req, "type", errors.New("type is required")
	}
	if len(req.Payload) == 0 || string(req.Payload) == "null" {
		return req, "payload", errors.New("payload is required")
	}
	if req.Payload[0] != '{' {
		return req, "payload", errors.New("payload must be a JSON object")
	}
	// The payload is checked on its own, so that its limits (depth above all) count from the payload itself;
	// then the body, for the one thing left there: the envelope naming type, payload or wait twice, which
	// the decoder above settles case-insensitively and silently, last one winning.
	if field, err := checkLimits(req.Payload, "payload", jsonlimit.Limits{}); err != nil {
		return req, field, err
	}
	if field, err := checkLimits(body, "", jsonlimit.Limits{MaxDepth: jsonlimit.DefaultMaxDepth + 1}); err != nil {
		return req, field, err
	}
	return req, "", nil
}

// checkLimits applies l to doc, whose place in the request is at, and names the field at fault
// ("payload.to[0]") with the reason.
func checkLimits(doc []byte, at string, l jsonlimit.Limits) (string, error) {
	var le *jsonlimit.Error
	if err := jsonlimit.Check(doc, l); !errors.As(err, &le) {
		return "", nil // within the limits, or a syntax error, which the decoder has already reported
	}
	field := at
	switch {
	case le.Path == "":
	case at == "" || strings.HasPrefix(le.Path, "["):
		field += le.Path
	default:
		field += "." + le.Path
	}
	return field, fmt.Errorf("%s: %s", field, le.Reason)
}

func parseWait(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration like 5s", s)
	}
	if d > MaxWait {
		return 0, fmt.Errorf("%v is over the longest wait, %v", d, MaxWait)
	}
	return d, nil
}

// waitTerminal re-reads the effect until it is terminal or wait runs out, woken by this gateway's dispatcher
// when it records the outcome, by the notification another gateway's sends, or by the poll that reads every
// waited-for effect at once (poll, in notify.go), which alone ends waits while notifications are off. It
// returns the latest state it read, and whether the wait was cut short: not begun because the tenant holds
// all its held_requests, or shed to free the connection for another tenant (held.go). Either way the caller
// answers with the effect as it is, as when a wait runs out, and Retry-After says when to look again.
func (g *Gateway) waitTerminal(ctx context.Context, tenant string, e *dedup.Effect, wait time.Duration) (*dedup.Effect, bool) {
	shed, release, ok := g.held.holdWait(ctx, tenant)
	if !ok {
		g.metrics.heldCut.WithLabelValues(tenant, "wait").Inc()
		return e, true
	}
	defer release()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for !e.Status.Terminal() {
		ch, forget := g.waiters.add(e.ID)
		// Read after registering, so an outcome recorded in between is not missed.
		next, err := g.get(ctx, tenant, e.Key)
		if err == nil {
			e = next
		}
		if e.Status.Terminal() {
			forget()
			break
		}
		select {
		case <-ch:
		case <-deadline.C:
			forget()
			return g.latest(ctx, tenant, e), false
		case <-shed.Done():
			forget()
			if ctx.Err() != nil {
				return e, false
			}
			g.metrics.heldCut.WithLabelValues(tenant, "shed").Inc()
			return g.latest(ctx, tenant, e), true
		}
	}
	return e, false
}

// waitCut marks an answer whose wait was cut short (waitTerminal): the client polls again after Retry-After.
func waitCut(w http.ResponseWriter, cut bool) {
	if cut {
		w.Header().Set("Retry-After", "1")
	}
}

// latest re-reads e, so a wait that ran out answers with the state at its end, not at its start.
func (g *Gateway) latest(ctx context.Context, tenant string, e *dedup.Effect) *dedup.Effect {
	if next, err := g.get(ctx, tenant, e.Key); err == nil {
		return next
	}
	return e
}

func (g *Gateway) get(ctx context.Context, tenant, key string) (*dedup.Effect, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(g.cfg.Timeouts.Database))
	defer cancel()
	return g.store.Get(ctx, tenant, key)
}

// pathKey is the key a path names, held to the header's rules: a key no create could have recorded is a 400
// naming it, not a 404 (or, for a NUL byte, Postgres's refusal).
func pathKey(r *http.Request) (string, error) {
	key, err := url.PathUnescape(mux.Vars(r)["key"])
	if err != nil {
		return "", invalid("key", "the key in the path is not validly escaped")
	}
	if err := dedup.CheckKey(key); err != nil {
		return "", invalid("key", "the key in the path: "+err.Error())
	}
	return key, nil
}

// effectPath is the effect's API path: effect.Path, shared with the Go client.
func effectPath(key string) string { return effect.Path(key) }

// query reads a request's query string, refusing what URL.Query would pass over in silence: a pair that is
// not validly percent-encoded (a mangled cursor read as none started the listing again from its first page),
// a parameter the handler does not take (?Status=dead listed every effect; ?wait=5s on a create waited for
// nothing: its wait goes in the body), and one sent more than once (which one would count?), as a duplicate
// header or JSON member is refused.
func query(r *http.Request, names ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, invalid("query", fmt.Sprintf("the query string is not validly percent-encoded: %v", err))
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		switch {
		case name == "":
			return nil, invalid("query", "the query string has a parameter without a name (?=…)")
		case !slices.Contains(names, name) && len(names) == 0:
			return nil, invalid(name, fmt.Sprintf("%s is not a parameter of %s %s, which takes none", name, r.Method,
				routeOf(r)))
		case !slices.Contains(names, name):
			return nil, invalid(name, fmt.Sprintf("%s is not a parameter of %s %s, which takes %s", name, r.Method,
				routeOf(r), strings.Join(names, ", ")))
		case len(q[name]) > 1:
			return nil, invalid(name, fmt.Sprintf("%s is sent %d times; send it once", name, len(q[name])))
		}
	}
	return q, nil
}

// routeOf is the request's route as the API's docs write it.
func routeOf(r *http.Request) string {
	if rt := mux.CurrentRoute(r); rt != nil {
		if t, err := rt.GetPathTemplate(); err == nil {
			return t
		}
	}
	return r.URL.Path
}

func (g *Gateway) getEffect(w http.ResponseWriter, r *http.Request) error {
	key, err := pathKey(r)
	if err != nil {
		return err
	}
	q, err := query(r, "wait")
	if err != nil {
		return err
	}
	wait, err := parseWait(q.Get("wait"))
	if err != nil {
		return invalid("wait", err.Error())
	}
	e, err := g.get(r.Context(), tenantOf(r), key)
	if errors.Is(err, dedup.ErrNotFound) {
		return refuse(probNotFound, "", notFound(key))
	}
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.cfg.Timeouts.Database))
	err = g.durableRead(dctx, e)
	cancel()
	if err != nil {
		return about(err, key, e.Type)
	}
	if wait > 0 && !e.Status.Terminal() {
		var cut bool
		e, cut = g.waitTerminal(r.Context(), tenantOf(r), e, wait)
		waitCut(w, cut)
	}
	writeJSON(w, http.StatusOK, e)
	return nil
}

type listResponse struct {
	Data       []*dedup.Effect `json:"data"`
	NextCursor *string         `json:"next_cursor"`
}

func (g *Gateway) listEffects(w http.ResponseWriter, r *http.Request) error {
	q, err := query(r, "status", "type", "cursor", "limit")
	if err != nil {
		return err
	}
	f := dedup.Filter{Status: effect.Status(q.Get("status")), Type: q.Get("type"), Cursor: q.Get("cursor"),
		Limit: g.cfg.Limits.PageSize}
	if f.Status != "" && !f.Status.Valid() {
		return invalid("status", fmt.Sprintf("unknown status %q; one of %v", f.Status, effect.Statuses()))
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > g.cfg.Limits.MaxPageSize {
			return invalid("limit", fmt.Sprintf("limit must be a whole number from 1 to %d", g.cfg.Limits.MaxPageSize))
		}
		f.Limit = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.cfg.Timeouts.Database))
	defer cancel()
	page, err := g.store.List(ctx, tenantOf(r), f)
	if err != nil {
		return err
	}
	resp := listResponse{Data: page.Effects}
	if page.Next != "" {
		resp.NextCursor = &page.Next
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (g *Gateway) retryEffect(w http.ResponseWriter, r *http.Request) error {
	key, err := pathKey(r)
	if err != nil {
		return err
	}
	if _, err := query(r); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.cfg.Timeouts.Database))
	defer cancel()
	if _, listed := g.allowed[tenantOf(r)]; listed { // a retry delivers again: only a type the tenant may use
		if e, err := g.store.Get(ctx, tenantOf(r), key); err == nil && !g.allows(tenantOf(r), e.Type) {
			return g.typeNotAllowed(tenantOf(r), e.Type)
		}
	}
	e, err := g.store.Retry(ctx, tenantOf(r), key)
	if err != nil {
		return about(err, key, "")
	}
	g.dispatcher.WakeType(e.Type) // send_back.sql notifies the other gateways
	writeJSON(w, http.StatusOK, e)
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
