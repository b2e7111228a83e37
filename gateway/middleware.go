package gateway

// The middleware of every request: tracing, authentication, the tenant's rate and allow-list, panics, and the
// refusals answered from the headers alone (refuseUnread).

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/oncegate/oncegate/internal/tenantlimit"
)

// traced starts a server span per request, named after the route, continuing the caller's trace context.
// Probes and metrics are left out: they would drown the traces that matter. It is made once: mux applies a
// router's middleware to the matched route on every request, and otelhttp's set-up (its options, its
// instruments) cost a request more than the span it then starts.
func traced(spans bool) mux.MiddlewareFunc {
	if !spans {
		return propagated
	}
	return otelhttp.NewMiddleware("gateway",
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if route := mux.CurrentRoute(r); route != nil {
				if tmpl, err := route.GetPathTemplate(); err == nil {
					return r.Method + " " + tmpl
				}
			}
			return r.Method
		}),
		otelhttp.WithFilter(func(r *http.Request) bool {
			return strings.HasPrefix(r.URL.Path, "/v1/")
		}))
}

// propagated carries the caller's trace context (traceparent, baggage: the global propagator) into the
// request's context without a span of the gateway's own, as otelhttp does with a tracer that records nothing.
func propagated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header)); ctx != r.Context() {
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

type tenantKey struct{}

func tenantOf(r *http.Request) string { return r.Context().Value(tenantKey{}).(string) }

// authenticate resolves the bearer API key to its tenant. Every configured key's hash is compared, in
// constant time, so the time taken says nothing about which key came close. A refusal is answered from the
// headers alone, before any body is read (see refuseUnread).
func (g *Gateway) authenticate(next http.Handler) http.Handler {
	return g.authenticateBy("Authorization", next)
}

// authenticateBy is authenticate with the key read from header: Authorization takes the Bearer scheme; any
// other header (proxy.api_key_header, for SDKs that own Authorization) holds the key, "Bearer " optional.
func (g *Gateway) authenticateBy(header string, next http.Handler) http.Handler {
	bearer := http.CanonicalHeaderKey(header) == "Authorization"
	how := "send an API key as Authorization: Bearer <key>"
	if !bearer {
		how = "send an API key in the " + header + " header"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Values(header)) > 1 {
			// Two keys: reading either would be a guess at which tenant speaks.
			if bearer {
				w.Header().Set("WWW-Authenticate", `Bearer realm="oncegate", error="invalid_request"`)
			}
			refuseUnread(w, r, probUnauthorized, "the API key is sent more than once ("+header+"); send one")
			return
		}
		raw := r.Header.Get(header)
		// The scheme's name is case-insensitive (RFC 9110 §11.1): "bearer" is Bearer.
		token, ok := raw, false
		if len(raw) > len("Bearer ") && strings.EqualFold(raw[:len("Bearer ")], "Bearer ") {
			token, ok = raw[len("Bearer "):], true
		}
		if !bearer && !ok {
			token, ok = raw, true
		}
		if !ok || strings.TrimSpace(token) == "" {
			if bearer {
				w.Header().Set("WWW-Authenticate", `Bearer realm="oncegate"`)
			}
			refuseUnread(w, r, probUnauthorized, how)
			return
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
		tenant := ""
		for _, k := range g.keys {
			if subtle.ConstantTimeCompare(sum[:], k.hash) == 1 {
				tenant = k.tenant
			}
		}
		if tenant == "" {
			if bearer {
				w.Header().Set("WWW-Authenticate", `Bearer realm="oncegate", error="invalid_token"`)
			}
			refuseUnread(w, r, probUnauthorized, "the API key is not valid")
			return
		}
		if g.gate != nil && !g.gate.claim(r, tenant) {
			g.metrics.rateLimited.WithLabelValues(tenant, "connections").Inc()
			w.Header().Set("Retry-After", strconv.Itoa(g.gate.retryAfter(tenant, time.Now())))
			w.Header().Set("Connection", "close")
			refuseUnread(w, r, probRateLimited, "this API key's tenant holds more than its share of this "+
				"gateway's connections while they are scarce; retry after the time in Retry-After (with the "+
				"same Idempotency-Key: nothing was recorded)")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

// refusedBodyGrace is how long the server may go on reading a refused request's body after the answer: long
// enough for a client that sent its body at once, short enough that a slow one holds nothing.
const refusedBodyGrace = 500 * time.Millisecond

// refuseUnread answers a request whose body it will not read, and closes the connection. Left to itself,
// net/http reads up to 256 KiB of an unread body before it writes the answer (and again before it reuses the
// connection), so a client that sends its body slowly would hold the connection, unanswered, for as long as
// it likes. "Connection: close" makes the server write the answer at once. The read deadline then bounds the
// server's drain of the body: a body already sent is read to its end, so the close is clean and the client
// reads its answer (closing on unread data would reset the connection and could lose it), and a slow body is
// cut off.
func refuseUnread(w http.ResponseWriter, r *http.Request, k *ProblemKind, detail string) {
	if r.ContentLength != 0 { // a body declared (or chunked) and not read
		w.Header().Set("Connection", "close")
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(refusedBodyGrace))
	}
	writeProblem(w, k, "", detail)
}

// limitTenant spends the tenant's tokens (internal/tenantlimit): one request, and the body's bytes. A request
// token of a tenant whose rate the fleet holds (scope fleet) comes from this gateway's stock of the tenant's
// tokens, and waits on the database only when the stock is spent. A body of declared length is charged before it is read, so a refused one is never read; a chunked body is charged
// once read, and what it overdraws is paid by the tenant's next requests. Every route behind it counts,
// operator retries included.
func (g *Gateway) limitTenant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, now := tenantOf(r), time.Now()
		if ok, after := g.limiter.Request(r.Context(), tenant, now); !ok {
			g.tooMany(w, r, tenant, after, "requests")
			return
		}
		switch n := r.ContentLength; {
		case n > 0:
			// A body beyond limits.max_body is a 413 after max_body bytes: charge those. (The byte burst is
			// at least max_body, so every charge can pass in time.)
			if ok, after := g.limiter.Bytes(tenant, now, int(min(n, int64(g.cfg.Limits.MaxBody)))); !ok {
				g.tooMany(w, r, tenant, after, "bytes")
				return
			}
		case n < 0:
			body := &countingReader{ReadCloser: r.Body}
			r.Body = body
			defer func() { g.limiter.Charge(tenant, time.Now(), body.n) }()
		}
		if r.ContentLength != 0 {
			defer g.holdBody(w, r, tenant)()
		}
		next.ServeHTTP(w, r)
	})
}

// holdBody counts a request's body, while it arrives, among the tenant's held requests (held.go), and
// returns what ends the hold. A tenant that holds all of them gets heldBodyGrace for the body instead: one
// sent with its headers is read, one dribbled is cut off, and the handler answers that it could not read it.
func (g *Gateway) holdBody(w http.ResponseWriter, r *http.Request, tenant string) func() {
	release, ok := g.held.hold(tenant)
	if !ok {
		g.metrics.heldCut.WithLabelValues(tenant, "body").Inc()
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(heldBodyGrace))
		return release
	}
	r.Body = &releasingReader{ReadCloser: r.Body, release: release}
	return release
}

// releasingReader ends a body's hold once it has been read to its end (or failed): what follows, the work
// and the answer, holds the connection no longer than the gateway takes.
type releasingReader struct {
	io.ReadCloser
	release func()
}

func (b *releasingReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.release()
	}
	return n, err
}

// tooMany answers 429 for the tenant's bucket ("requests" or "bytes"), with the time the tokens will be there.
func (g *Gateway) tooMany(w http.ResponseWriter, r *http.Request, tenant string, after time.Duration, bucket string) {
	g.metrics.rateLimited.WithLabelValues(tenant, bucket).Inc()
	what := "requests"
	if bucket == "bytes" {
		what = "request-body bytes"
	}
	w.Header().Set("Retry-After", strconv.Itoa(tenantlimit.RetryAfterSeconds(after)))
	refuseUnread(w, r, probRateLimited, fmt.Sprintf("this API key's tenant is over its rate of %s; retry after "+
		"the time in Retry-After (with the same Idempotency-Key: nothing was recorded)", what))
}

type countingReader struct {
	io.ReadCloser
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += n
	return n, err
}

// allows reports whether tenant may use the effect type typ (tenants.<name>.effect_types).
func (g *Gateway) allows(tenant, typ string) bool {
	set, listed := g.allowed[tenant]
	return !listed || set[typ]
}

// typeNotAllowed answers a request for an effect type outside the tenant's list. It answers alike whether
// the type exists or not, and names only the tenant's own types, so a tenant learns nothing of the others'.
func (g *Gateway) typeNotAllowed(tenant, typ string) error {
	mine := make([]string, 0, len(g.allowed[tenant]))
	for t := range g.allowed[tenant] {
		mine = append(mine, t)
	}
	sort.Strings(mine)
	return refuse(probTypeNotAllowed, "type", fmt.Sprintf("this tenant may not use the effect type %q; its "+
		"types are %s", typ, strings.Join(mine, ", ")))
}

// recoverer turns a panic into a plain 500 problem: never a stack trace to the client.
func (g *Gateway) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				g.log.Error("handler panicked", "path", r.URL.Path, "panic", v)
				writeProblem(w, probInternal, "", "")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// refuseDotSegments answers 404 to a path with a bare "." or ".." segment. An RFC 3986 client removes such
// segments before it sends a request, and a proxy may too, so the same URL would name one resource here and
// another behind them: no route takes one. A key that is "." or ".." is sent percent-encoded (%2E, %2E%2E),
// as the gateway's Location does, and routed as a key.
func refuseDotSegments(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, seg := range strings.Split(r.URL.EscapedPath(), "/") {
			if seg == "." || seg == ".." {
				refuseUnread(w, r, probNotFound, `no such route: a path with a "." or ".." segment names no `+
					`resource here (send a key that is . or .. percent-encoded, as %2E or %2E%2E)`)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// limits is the tenant's rate for the limiter.
func (r RateLimit) limits() tenantlimit.Limits {
	l := tenantlimit.Limits{RequestsPerSecond: float64(r.RequestsPerSecond), RequestBurst: r.RequestBurst,
		BytesPerSecond: float64(r.BytesPerSecond), ByteBurst: int(r.ByteBurst), Fleet: r.Scope == ScopeFleet}
	if r.RequestsPerSecond == Unlimited {
		l.RequestsPerSecond = 0
	}
	if r.BytesPerSecond == Unlimited {
		l.BytesPerSecond = 0
	}
	return l
}
