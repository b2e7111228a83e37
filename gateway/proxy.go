package gateway

// The dedup proxy: /v1/proxy/{type}/{path…} for effect types whose provider is http (docs/proxy.md). A client
// points its HTTP client's base URL here and sends ordinary requests with an Idempotency-Key. This file is
// the HTTP side: it reads the request into an http effect's payload and renders what the request came to.
// Which request performs and which waits is proxyflow.go's, and the performing is the delivery engine's
// (outbox.Dispatcher.PerformNew and PerformExisting), so the breaker, the timeout, decide and the fenced
// Finish are those of every other delivery; the answer the client gets is rendered from the result that was
// stored, so that the first answer and every replay are the same bytes. A crash in flight leaves a leased
// row, which the outbox rescues by the type's on_crash.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/providers"
	httpprov "github.com/oncegate/oncegate/providers/http"
)

// proxyKeyHeader is the header that carries the tenant's API key on proxied requests.
func (g *Gateway) proxyKeyHeader() string {
	if g.cfg == nil || g.cfg.Proxy.APIKeyHeader == "" { // a Gateway built without New, as the route tests do
		return DefaultProxyAPIKeyHeader
	}
	return g.cfg.Proxy.APIKeyHeader
}

// proxyMethods are the methods the proxy takes: those the http provider sends.
var proxyMethods = []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete}

// safeMethod reports whether a method passes through unrecorded (RFC 9110 §9.2.1).
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// proxyRecheck is how often a request waiting for another's attempt under its key looks again, besides
// being woken when this gateway finishes one: the other may run in another gateway, or end pending.
const proxyRecheck = 100 * time.Millisecond

func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request) error {
	tenant := tenantOf(r)
	typ, err := url.PathUnescape(mux.Vars(r)["type"])
	if err != nil {
		refuseUnread(w, r, probNotFound, "the effect type in the path is not validly escaped")
		return nil
	}
	if !g.allows(tenant, typ) {
		return g.typeNotAllowed(tenant, typ)
	}
	p, _ := g.providers.Get(typ)
	hp, ok := p.(*httpprov.Provider)
	if !ok {
		refuseUnread(w, r, probNotFound, fmt.Sprintf("no effect type %q whose provider is http: only those "+
			"can be proxied", typ))
		return nil
	}
	m := g.metrics.proxied.MustCurryWith(map[string]string{"type": typ})
	// The path under the type, as it was sent (percent-encoding kept), and the query.
	prefix := "/v1/proxy/" + mux.Vars(r)["type"]
	// Nothing after the type is base_url as written (not base_url + "/").
	path := strings.TrimPrefix(r.URL.EscapedPath(), prefix)
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	unsafe := !safeMethod(r.Method)
	var key string
	if unsafe {
		if len(r.Header.Values("Idempotency-Key")) > 1 {
			m.WithLabelValues("refused").Inc()
			refuseUnread(w, r, probInvalid, "Idempotency-Key is sent more than once; send one key")
			return nil
		}
		if key, err = dedup.ParseKey(r.Header.Get("Idempotency-Key")); err != nil {
			m.WithLabelValues("refused").Inc()
			w.Header().Set("Connection", "close")
			return invalid("Idempotency-Key", r.Method+" through the proxy needs an Idempotency-Key "+
				"(GET, HEAD and OPTIONS pass through unrecorded): "+err.Error())
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(g.cfg.Limits.MaxBody)))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return refuse(probBodyTooLarge, "", fmt.Sprintf("the body is over the limit of %d bytes", g.cfg.Limits.MaxBody))
		}
		return invalid("", "could not read the request body")
	}
	// Which headers are sent on, dropped or refused, and how bytes are carried, is the http provider's header
	// policy (providers/http, headers.go), the same table a payload posted to /v1/effects is checked by.
	payload, err := hp.Proxied(r.Method, path, r.Header, body, g.proxyKeyHeader())
	if err != nil {
		m.WithLabelValues("refused").Inc()
		field, detail := "", err.Error()
		var fe *providers.FieldError
		if errors.As(err, &fe) {
			// payload.headers.X is the request's header X, payload.path its path: say it the client's way.
			field = strings.TrimPrefix(strings.TrimPrefix(fe.Field, "payload."), "headers.")
			detail = field + ": " + fe.Msg
		}
		return invalid(field, detail)
	}
	if !unsafe {
		m.WithLabelValues("passed").Inc()
		g.pass(w, r, hp, typ, payload)
		return nil
	}

	span := trace.SpanFromContext(r.Context())
	span.SetAttributes(attribute.String("idempotency.key", key), attribute.String("effect.type", typ),
		attribute.String("tenant", tenant))
	wait := g.cfg.inFlightWait(typ)
	// The request holds its connection while it performs or waits: one of the tenant's held requests
	// (held.go). Past them it does not wait for another's attempt, and is answered 409 at once.
	release, ok := g.held.hold(tenant)
	defer release()
	if !ok {
		g.metrics.heldCut.WithLabelValues(tenant, "wait").Inc()
		wait = 0
	}
	tags, field, err := requestTags(r, nil)
	if err != nil {
		m.WithLabelValues("refused").Inc()
		return invalid(field, err.Error())
	}
	out := g.proxyFlow().run(r.Context(), dedup.NewEffect{Tenant: tenant, Key: key, Type: typ, Payload: payload,
		Tags: tags, Terms: effect.SearchTerms(tags, nil), Destination: providers.Destination(p, payload)},
		proxyFingerprint(typ, r.Method, path, r.Header.Get("Content-Type"), body), wait)
	span.SetAttributes(attribute.Bool("idempotency.replayed", out.Kind != performedHere))
	return g.answerProxied(w, r, m, tenant, typ, key, out)
}

// proxyFlow is the gateway's flow for proxied requests, over its dispatcher and store.
func (g *Gateway) proxyFlow() *proxyFlow {
	return &proxyFlow{engine: proxyEngineOf{g.dispatcher, g}, answers: &g.proxyAnswers, watch: g.waiters.add,
		wake: g.waiters.wake, recheck: proxyRecheck}
}

// proxyEngineOf is the gateway's proxyEngine: its dispatcher performs, its store reads.
type proxyEngineOf struct {
	*outbox.Dispatcher
	g *Gateway
}

func (e proxyEngineOf) Get(ctx context.Context, tenant, key string) (*dedup.Effect, error) {
	return e.g.get(ctx, tenant, key)
}

// answerProxied renders what a proxied request came to.
func (g *Gateway) answerProxied(w http.ResponseWriter, r *http.Request, m *prometheus.CounterVec, tenant, typ, key string, out proxyOutcome) error {
	switch out.Kind {
	case performedHere:
		p := out.Performed
		if !p.Recorded {
			// The lease was lost (this gateway was paused past it, and another rescued the effect) or the
			// database stayed away: the upstream's answer is not the effect's, and every replay will give
			// the one that is recorded. The client gets that one, or is told to come back for it.
			g.log.Warn("a proxied request's outcome was not recorded; its client gets the effect's recorded answer",
				"type", typ, "key", key, "status", p.Status)
			return g.unrecorded(w, r, m, tenant, key, typ)
		}
		if out.Created {
			g.metrics.effectsCreated.WithLabelValues(typ).Inc()
		}
		if p.Status.Terminal() {
			m.WithLabelValues("performed").Inc()
			g.render(w, p.Status, p.Finish.Result, p.Finish.LastError, false)
			return nil
		}
		// Pending: a transient failure (or a breaker that held the call). Its answer is the client's to see
		// and is not stored: a retry under the key performs the request again.
		m.WithLabelValues("retried").Inc()
		transientAnswer(p)(w, false)
	case replayedStored:
		e := out.Effect
		m.WithLabelValues("replayed").Inc()
		g.metrics.replays.WithLabelValues(e.Type).Inc()
		g.renderStored(w, e)
	case sharedTransient:
		m.WithLabelValues("replayed").Inc()
		p := out.Performed
		transientAnswer(p)(w, true)
	case attemptEnded:
		// The attempt it waited for ended transiently in another gateway, whose answer was not stored: say
		// when to come back.
		e := out.Effect
		m.WithLabelValues("replayed").Inc()
		w.Header().Set("Idempotent-Replayed", "true") // the answer is another request's attempt's
		retry := 1
		if e.Status == effect.StatusPending && e.NextAttemptAt != nil {
			retry = max(1, int(time.Until(*e.NextAttemptAt).Seconds()+0.999))
		}
		w.Header().Set("Retry-After", strconv.Itoa(retry))
		writeProblem(w, probUpstreamUnreachable, "", "the attempt this request waited for failed "+
			"transiently and was not stored: "+deref(e.LastError))
	case stillInFlight:
		g.inFlight(w, m, key)
	case typePausedNow:
		m.WithLabelValues("paused").Inc()
		return about(dedup.ErrTypePaused, key, typ)
	case effectGone:
		// Purged by retention meanwhile: the key is free, and the client's retry records it anew.
		w.Header().Set("Retry-After", "1")
		return refuse(probInFlight, "Idempotency-Key", "the effect under the key was just purged; retry")
	case clientGone:
	case failed:
		var reused *dedup.KeyReusedError
		if errors.As(out.Err, &reused) {
			m.WithLabelValues("key_reused").Inc()
		}
		return about(out.Err, key, typ)
	}
	return nil
}

// unrecorded answers a request whose attempt's outcome could not be recorded: with the effect's recorded
// answer when it is terminal (another attempt's, marked as a replay), else with 409 and Retry-After, so
// that the client's retry gets the answer the effect comes to.
func (g *Gateway) unrecorded(w http.ResponseWriter, r *http.Request, m *prometheus.CounterVec, tenant, key, typ string) error {
	e, err := g.get(context.WithoutCancel(r.Context()), tenant, key)
	switch {
	case err == nil && e.Status.Terminal():
		m.WithLabelValues("replayed").Inc()
		g.renderStored(w, e)
		return nil
	case err != nil && !errors.Is(err, dedup.ErrNotFound):
		return about(err, key, typ)
	}
	m.WithLabelValues("in_flight").Inc()
	w.Header().Set("Retry-After", "1")
	return refuse(probInFlight, "Idempotency-Key", fmt.Sprintf("the request under the key %q reached the "+
		"upstream, but its outcome could not be recorded (this gateway lost the effect's lease, or the database "+
		"was away), and the effect is being settled; retry with the same key and request for its answer", key))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// proxyFingerprint identifies a proxied request: method, path and query as sent, content type and the
// body's bytes. Other headers are recorded and sent, but do not make a retry another request: an SDK may
// send fresh telemetry headers on each try.
func proxyFingerprint(typ, method, path, contentType string, body []byte) []byte {
	sum := sha256.Sum256(body)
	doc, _ := json.Marshal(map[string]string{"method": method, "path": path, "content_type": contentType,
		"body_sha256": hex.EncodeToString(sum[:])})
	fp, _ := dedup.Fingerprint(typ, doc)
	return fp
}

// answerHeaders copies an upstream's answer headers to w: without Idempotent-Replayed, which is the
// gateway's to say (an upstream's would pass a first answer off as a replay), and with no Content-Type when
// the upstream sent none, where net/http would sniff one.
func answerHeaders(w http.ResponseWriter, h http.Header) {
	for k, vs := range h {
		w.Header()[k] = vs
	}
	w.Header().Del("Idempotent-Replayed")
	if _, ok := h["Content-Type"]; !ok {
		w.Header()["Content-Type"] = nil
	}
}

// pass sends a safe request on, unrecorded, and streams the answer back, masking the configured header
// values as a stored answer is masked. The upstream's Content-Length is kept when masking cannot change the
// length (and always for HEAD, which has no body); a body that breaks off, by a reset or the type's
// timeout, aborts the client's connection, so that a cut-short answer never looks complete.
func (g *Gateway) pass(w http.ResponseWriter, r *http.Request, hp *httpprov.Provider, typ string, payload []byte) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.cfg.EffectTypes[typ].Timeout))
	defer cancel()
	resp, err := hp.Pass(ctx, payload)
	if err != nil {
		g.upstreamFailed(w, ctx.Err() != nil, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 {
		// A 1xx final answer (101 above all) would leave the client's connection in another protocol.
		writeProblem(w, probUpstreamUnreachable, "", fmt.Sprintf("the upstream answered %d, an interim "+
			"status, as its final answer: not forwarded", resp.StatusCode))
		return
	}
	answerHeaders(w, hp.AnswerHeaders(resp.Header))
	switch {
	case r.Method == http.MethodHead:
		if cl := resp.Header.Get("Content-Length"); cl != "" {
			w.Header().Set("Content-Length", cl)
		}
	case resp.ContentLength >= 0 && !hp.Masks():
		w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	w.WriteHeader(resp.StatusCode)
	n, err := io.Copy(w, hp.MaskStream(resp.Body))
	if err != nil || (resp.ContentLength >= 0 && !hp.Masks() && n < resp.ContentLength && r.Method != http.MethodHead) {
		g.log.Warn("a passed-through answer broke off; the client's connection is aborted", "type", typ,
			"bytes", n, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// transientAnswer writes the answer to an attempt that left its effect pending; replayed marks it as
// another request's answer.
func transientAnswer(p *outbox.Performed) func(w http.ResponseWriter, replayed bool) {
	attempted, result, err := p.Attempted, p.Outcome.Result, p.Outcome.Err
	return func(w http.ResponseWriter, replayed bool) {
		if replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		switch {
		case !attempted:
			w.Header().Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(p.Wait.Seconds())))))
			switch p.Held {
			case outbox.HeldByLimit:
				writeProblem(w, probDestinationLimited, "", "the effect type's rate left no call to the upstream "+
					"free; nothing was sent")
			case outbox.HeldByPause:
				writeProblem(w, probDestinationPaused, "", "the upstream asked every gateway to wait with this tenant's calls; nothing was sent")
			default:
				writeProblem(w, probBreakerOpen, "", "the upstream's circuit breaker is open; nothing was sent")
			}
			return
		case len(result) > 0:
			var a httpprov.Answer
			if json.Unmarshal(result, &a) == nil && a.Status != 0 {
				if a.BodyOverLimit {
					w.Header().Set("Retry-After", "1")
					writeProblem(w, probAnswerTooLarge, "", fmt.Sprintf("the upstream answered %d, a transient "+
						"failure that was not stored, with a body over http.max_answer (%d bytes)", a.Status, a.MaxAnswer))
					return
				}
				writeAnswer(w, a, replayed)
				return
			}
		}
		timedOut := errors.Is(err, context.DeadlineExceeded) || strings.HasPrefix(errString(err), "timed out")
		w.Header().Set("Retry-After", "1")
		if timedOut {
			writeProblem(w, probUpstreamTimeout, "", errString(err))
			return
		}
		writeProblem(w, probUpstreamUnreachable, "", errString(err))
	}
}

// inFlight answers a request that waited for another's attempt under key as long as it may.
func (g *Gateway) inFlight(w http.ResponseWriter, m *prometheus.CounterVec, key string) {
	m.WithLabelValues("in_flight").Inc()
	w.Header().Set("Retry-After", "1")
	writeProblem(w, probInFlight, "Idempotency-Key", fmt.Sprintf("a request under the key %q is "+
		"being performed; retry with the same key and request", key))
}

// render answers with a terminal effect of the proxy: the stored answer as it came, or the problem its
// status names. replayed adds Idempotent-Replayed. A dead effect is the gateway's answer, not the upstream's:
// its result holds the last transient answer (a 5xx, a 429) for GET /v1/effects, but that answer said "try
// again", and no request under the key will.
// renderStored answers a replay with the stored effect: as render does, or, when its answer expired
// (retention.payloads), with a problem saying so and what became of the request.
func (g *Gateway) renderStored(w http.ResponseWriter, e *dedup.Effect) {
	if e.BodyExpired {
		w.Header().Set("Idempotent-Replayed", "true")
		writeProblem(w, probAnswerExpired, "", fmt.Sprintf("the request was performed (its effect is %s, "+
			"created %s); its stored answer expired under retention.payloads", e.Status,
			e.CreatedAt.UTC().Format(time.RFC3339)))
		return
	}
	g.render(w, e.Status, e.Result, deref(e.LastError), true)
}

func (g *Gateway) render(w http.ResponseWriter, status effect.Status, result json.RawMessage, lastErr string, replayed bool) {
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	if status == effect.StatusDead {
		writeProblem(w, probGaveUp, "", lastErr)
		return
	}
	var a httpprov.Answer
	if len(result) > 0 && json.Unmarshal(result, &a) == nil && a.Status != 0 {
		if a.BodyOverLimit {
			writeProblem(w, probAnswerTooLarge, "", fmt.Sprintf("the upstream answered %d with a body over "+
				"http.max_answer (%d bytes); the effect is %s, with its status and headers", a.Status, a.MaxAnswer, status))
			return
		}
		writeAnswer(w, a, replayed)
		return
	}
	switch status {
	case effect.StatusUnknown:
		writeProblem(w, probOutcomeUnknown, "", lastErr)
	case effect.StatusDead:
		writeProblem(w, probGaveUp, "", lastErr)
	default: // failed without an answer: the address guard, or a request the upstream never saw
		writeProblem(w, probUpstreamUnreachable, "", lastErr)
	}
}

// writeAnswer writes an upstream's answer as stored.
func writeAnswer(w http.ResponseWriter, a httpprov.Answer, replayed bool) {
	answerHeaders(w, a.Header())
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	body := a.Bytes()
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(a.Status)
	_, _ = w.Write(body)
}

// upstreamFailed answers a request that got no answer from the upstream.
func (g *Gateway) upstreamFailed(w http.ResponseWriter, timedOut bool, err error) {
	w.Header().Set("Retry-After", "1")
	if timedOut {
		writeProblem(w, probUpstreamTimeout, "", errString(err))
		return
	}
	writeProblem(w, probUpstreamUnreachable, "", errString(err))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
