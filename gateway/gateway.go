// Package gateway is oncegate's HTTP service: workers ask it to perform a side effect under an idempotency
// key, and it performs that effect once, however often it is asked. It records each effect and its outbox
// row in one transaction under a unique (tenant, key) constraint (package dedup), and runs the dispatcher
// that delivers outbox rows to providers (package outbox) in the same process.
//
// It runs on Postgres directly or behind PgBouncer in transaction pooling mode (database.go): there it uses
// no prepared statement and no session state, listens for notifications only on a connection of its own
// (listen_url), proves with a self-check that they arrive, and polls whenever they do not (notify.go).
//
// Its promise to a client: a request that got a 2xx was recorded and will be delivered (or end failed, dead
// or unknown, visible on the effect); a request that got anything else recorded nothing, and retrying it
// with the same key is always safe.
package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/internal/notifier"
	"github.com/oncegate/oncegate/internal/tenantlimit"
	"github.com/oncegate/oncegate/migrations"
	"github.com/oncegate/oncegate/outbox"
	"github.com/oncegate/oncegate/providers"
)

//go:embed openapi.yaml
var openAPI []byte

// Gateway is the HTTP API and the dispatcher over one database.
type Gateway struct {
	cfg        *Config
	log        *slog.Logger
	pool       *pgxpool.Pool
	probe      *poolerProbe
	store      *dedup.Store
	dispatcher *outbox.Dispatcher
	providers  *providers.Registry
	// heard is set while the notification self-check passes (notify.go); until then, the gateway polls fast.
	heard atomic.Bool
	// newEffects tells the other gateways' dispatchers of new effects, outside the requests' transactions.
	newEffects    *notifier.Batcher
	noServerSpans bool // Options.NoServerSpans
	keys          []apiKey
	limiter       *tenantlimit.Limiter
	allowed       map[string]map[string]bool // tenant → the effect types it may use; none listed: all
	waiters       *waiters
	proxyAnswers  attempts // the answers of proxied attempts that ended transiently, for their waiters
	router        *mux.Router
	handler       http.Handler // router, behind refuseDotSegments
	metrics       *metrics
	registry      *prometheus.Registry // metrics.registry: what /metrics serves

	// replays and attempts gather, for the operator, the replays absorbed and the delivery attempts made,
	// and write them in batches (dedup.ReplayLog, dedup.AttemptLog).
	replays  *dedup.ReplayLog
	attempts *dedup.AttemptLog
}

type apiKey struct {
	hash   []byte
	tenant string
}

// Options are what a gateway takes besides its configuration file.
type Options struct {
	Logger *slog.Logger
	// DispatcherOwner names this gateway's leases; defaults to host, PID and a random suffix.
	DispatcherOwner string
	// DriverTracing makes the spans of Postgres calls (telemetry.Telemetry.Children: only inside a trace).
	// Nil traces no database calls.
	DriverTracing trace.TracerProvider
	// NoServerSpans starts no span per request: the caller's trace context is still read from the request's
	// headers and goes on, with the effect, to its delivery. The gateway binary sets it when no exporter is
	// configured (telemetry.Exporting), where otelhttp's work for each request (attributes, metrics, a span
	// that records nothing) was a tenth of the gateway's CPU.
	NoServerSpans bool
}

// New connects to the database (lazily: a database that is down makes requests fail with 503, not New) and
// builds the gateway. A nil cfg is all defaults; unset fields take theirs (Config.WithDefaults).
func New(cfg *Config, opts Options) (*Gateway, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("gateway: config: %w", err)
	}
	reg, err := cfg.registry()
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	pool, probe, err := newPool(context.Background(), cfg, log, func(pcfg *pgxpool.Config) {
		if opts.DriverTracing != nil {
			pcfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(opts.DriverTracing))
		}
	})
	if err != nil {
		_ = reg.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	types := cfg.outboxTypes(reg)
	groupCommit := dedup.GroupCommit{MaxBatch: cfg.GroupCommit.MaxBatch, Parallel: cfg.GroupCommit.Parallel,
		Timeout: time.Duration(cfg.Timeouts.Database)}
	store := dedup.NewStore(pool).WithGroupCommit(groupCommit)
	m := newMetrics(store, time.Duration(cfg.Timeouts.Metrics))
	w := newWaiters()
	attempts := dedup.NewAttemptLog(pool, 0, log)
	d, err := outbox.New(pool, outbox.Config{
		Attempts:     attempts,
		Types:        types,
		Owner:        opts.DispatcherOwner,
		Retention:    time.Duration(cfg.Retention.Keys),
		PollInterval: time.Duration(cfg.Dispatcher.PollInterval),
		LeaseMargin:  time.Duration(cfg.Dispatcher.LeaseMargin),
		DrainTimeout: time.Duration(cfg.Dispatcher.DrainTimeout),
		GroupCommit:  groupCommit,
		OnFinished:   w.wake,
		Metrics:      m.dispatcher,
		Logger:       log,
	})
	if err != nil {
		pool.Close()
		_ = reg.Close()
		return nil, err
	}
	g := &Gateway{cfg: cfg, log: log, pool: pool, probe: probe, store: store, dispatcher: d, providers: reg,
		waiters: w, metrics: m, registry: m.registry, replays: dedup.NewReplayLog(pool, 0, log), attempts: attempts,
		newEffects: notifier.NewBatcher(pool, notifier.TopicOutbox, notifyInterval, log), noServerSpans: opts.NoServerSpans}
	tenants := make([]string, 0, len(cfg.Tenants))
	for t := range cfg.Tenants {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	g.allowed = map[string]map[string]bool{}
	for _, t := range tenants {
		for _, k := range cfg.Tenants[t].APIKeys {
			h, _ := keyHash(k) // checked by validate
			g.keys = append(g.keys, apiKey{hash: h, tenant: t})
		}
		if types := cfg.Tenants[t].EffectTypes; types != nil {
			g.allowed[t] = map[string]bool{}
			for _, typ := range types {
				g.allowed[t][typ] = true
			}
		}
	}
	g.limiter = tenantlimit.New(func(tenant string) tenantlimit.Limits { return cfg.Tenants[tenant].Rate.limits() })
	g.router = g.routes()
	g.handler = refuseDotSegments(g.router)
	return g, nil
}

// Close releases the database pool and the providers.
func (g *Gateway) Close() {
	g.pool.Close()
	_ = g.providers.Close()
}

// Handler returns the HTTP API.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Migrate applies pending migrations, waiting up to timeouts.migration_lock for a gateway that migrates
// meanwhile.
func (g *Gateway) Migrate(ctx context.Context) error {
	return migrate(ctx, g.pool, g.log, time.Duration(g.cfg.Timeouts.MigrationLock))
}

// Migrate applies pending migrations to the database at databaseURL, without a gateway: `gateway migrate`
// with no configuration file, which needs neither tenants nor effect types.
func Migrate(ctx context.Context, databaseURL string, log *slog.Logger) error {
	pool, _, err := newPool(ctx, &Config{DatabaseURL: databaseURL}, log, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrate(ctx, pool, log, DefaultMigrationLock)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, lockWait time.Duration) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	v, err := migrations.UpWithin(ctx, db, log, lockWait)
	if err != nil {
		return err
	}
	log.Info("database schema is current", "version", v)
	return nil
}

// Check asks every provider that can check its destination (providers.Checker) whether it can deliver:
// a start that could only send every effect of a type to dead letters stops, saying what to fix. A check
// that cannot run (the database is down) is logged, and does not stop the start.
func (g *Gateway) Check(ctx context.Context) error {
	var errs []error
	for _, name := range g.providers.Names() {
		p, _ := g.providers.Get(name)
		c, ok := p.(providers.Checker)
		if !ok {
			continue
		}
		err := c.Check(ctx, g.pool)
		switch {
		case errors.Is(err, providers.ErrCannotCheck):
			// A gateway starts without its database, and answers 503 until it is back.
			g.log.Warn("could not check the destination of an effect type at start-up", "type", name, "err", err)
		case err != nil:
			errs = append(errs, fmt.Errorf("effect type %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Serve runs the HTTP API on l and the dispatcher until ctx ends, then shuts down gracefully: it stops
// accepting, lets requests in flight finish (up to timeouts.shutdown), stops the dispatcher (which drains its
// deliveries and hands back the rest) and returns.
//
// Everything a client controls is bounded: the time to send headers (timeouts.read_header) and the whole
// request (timeouts.read), the time until the answer is written (timeouts.write), how long a keep-alive
// connection may sit idle (timeouts.idle), the size of headers (limits.max_header) and of bodies
// (limits.max_body), and the number of open connections (limits.max_connections).
func (g *Gateway) Serve(ctx context.Context, l net.Listener) error {
	t := g.cfg.Timeouts
	srv := &http.Server{Handler: g.handler, ReadHeaderTimeout: time.Duration(t.ReadHeader),
		ReadTimeout: time.Duration(t.Read), WriteTimeout: time.Duration(t.Write), IdleTimeout: time.Duration(t.Idle),
		MaxHeaderBytes: int(g.cfg.Limits.MaxHeader),
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)}
	// Over the cap, Accept waits: the kernel holds further connections in the listen backlog, costing this
	// process no descriptor, and they are served, in order, as soon as a connection closes, which the timeouts
	// above bound. Refusing them instead (accept, answer 503, close) would spend a descriptor and a write on
	// each and turn a wait of seconds into an error the client must retry. netutil.LimitListener is that gate.
	l = netutil.LimitListener(l, g.connectionCap())
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	// New effects are announced until the last request has been answered, and what is queued then is sent.
	announce, stopAnnounce := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAnnounce()
	var wg sync.WaitGroup
	wg.Go(func() { g.newEffects.Run(announce) })
	wg.Go(func() { g.replays.Run(announce) })
	wg.Go(func() { g.listen(bg) })
	wg.Go(func() { g.poll(bg) })
	wg.Go(func() { g.heartbeat(bg, l.Addr().String()) })
	if g.cfg.Dispatcher.Disabled {
		g.log.Info("dispatcher disabled: this gateway records effects, other gateways deliver them")
	} else {
		// The attempt log outlives the dispatcher, so that the attempts of its last deliveries are written.
		attemptsCtx, stopAttempts := context.WithCancel(context.WithoutCancel(ctx))
		wg.Go(func() { g.attempts.Run(attemptsCtx) })
		wg.Go(func() { defer stopAttempts(); _ = g.dispatcher.Run(bg) })
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(g.cfg.Timeouts.Shutdown))
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		g.log.Warn("HTTP shutdown", "err", serr)
	}
	stopAnnounce()
	stopBG()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

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

// limitTenant spends the tenant's tokens (internal/tenantlimit): one request, and the body's bytes. A body of
// declared length is charged before it is read, so a refused one is never read; a chunked body is charged
// once read, and what it overdraws is paid by the tenant's next requests. Every route behind it counts,
// operator retries included.
func (g *Gateway) limitTenant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, now := tenantOf(r), time.Now()
		if ok, after := g.limiter.Request(tenant, now); !ok {
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
		next.ServeHTTP(w, r)
	})
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
func (g *Gateway) typeNotAllowed(w http.ResponseWriter, tenant, typ string) {
	mine := make([]string, 0, len(g.allowed[tenant]))
	for t := range g.allowed[tenant] {
		mine = append(mine, t)
	}
	sort.Strings(mine)
	writeProblem(w, probTypeNotAllowed, "type", fmt.Sprintf("this tenant may not use the effect type %q; its "+
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

func (g *Gateway) routes() *mux.Router {
	r := mux.NewRouter()
	// Keys may contain "/": keep %2F encoded while routing, and unescape the variable ourselves.
	r.UseEncodedPath()
	// mux would otherwise answer a path with a dot segment or an empty one with a 301 to its cleaned form,
	// which is another resource ("/v1/effects/." to the list) that a client follows without knowing. A path
	// is routed as it is sent, and one that is not a route is a 404.
	r.SkipClean(true)
	r.Use(g.recoverer, traced(!g.noServerSpans))
	// RFC 9110 §9.1: HEAD wherever GET. net/http answers a HEAD with the status and headers the handler
	// writes and drops its body.
	get := []string{http.MethodGet, http.MethodHead}
	r.HandleFunc("/healthz", g.healthz).Methods(get...)
	r.HandleFunc("/readyz", g.readyz).Methods(get...)
	r.Handle("/metrics", promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})).Methods(get...)
	r.HandleFunc("/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(openAPI)
	}).Methods(get...)
	r.HandleFunc(problemsPath+"{name}", problemPage).Methods(get...)

	// The API's routes sit on the root router, each wrapped, rather than on a "/v1" subrouter: a subrouter's
	// routes repeat its prefix matcher, whose match erases a sibling route's method mismatch, so a wrong
	// method on a /v1 path came out as a 404.
	v1 := func(h http.HandlerFunc) http.Handler { return g.authenticate(g.limitTenant(h)) }
	r.Handle("/v1/effects", v1(g.createEffect)).Methods(http.MethodPost)
	r.Handle("/v1/effects", v1(g.listEffects)).Methods(get...)
	r.Handle("/v1/effects/{key}", v1(g.getEffect)).Methods(get...)
	r.Handle("/v1/effects/{key}/retry", v1(g.retryEffect)).Methods(http.MethodPost)
	// The dedup proxy takes every method; its key header is its own (proxy.api_key_header).
	proxied := g.authenticateBy(g.proxyKeyHeader(), g.limitTenant(http.HandlerFunc(g.proxy)))
	// Methods upper-cases the slice it is given in place: each route gets a copy, or gateways built at once race.
	r.Handle("/v1/proxy/{type}", proxied).Methods(slices.Clone(proxyMethods)...)
	r.Handle("/v1/proxy/{type}/{path:.*}", proxied).Methods(slices.Clone(proxyMethods)...)

	// Neither answer reads the body or asks for an API key: the path, or its method, exists for no one.
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		refuseUnread(w, req, probNotFound, "no such route")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Allow", strings.Join(allowedMethods(r, req), ", "))
		refuseUnread(w, req, probMethodNotAllowed, fmt.Sprintf("%s is not a method of this path", req.Method))
	})
	return r
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

// allowedMethods lists the methods that root serves at req's path, for the Allow header of a 405.
func allowedMethods(root *mux.Router, req *http.Request) []string {
	seen := map[string]bool{}
	_ = root.Walk(func(route *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		methods, err := route.GetMethods()
		if err != nil {
			return nil // a route of no particular method: none here
		}
		for _, m := range methods {
			probe := *req
			probe.Method = m
			var match mux.RouteMatch
			if route.Match(&probe, &match) && match.MatchErr == nil {
				seen[m] = true
			}
		}
		return nil
	})
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

func (g *Gateway) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// readyz is ready when the database answers and its schema has every migration this binary knows.
func (g *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.cfg.Timeouts.Ready))
	defer cancel()
	if err := g.pool.Ping(ctx); err != nil {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, probUnavailable, "", "the database cannot be reached")
		return
	}
	db := stdlib.OpenDBFromPool(g.pool)
	defer func(db *sql.DB) { _ = db.Close() }(db)
	pending, err := migrations.Pending(ctx, db)
	if err != nil || pending {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, probUnavailable, "", "the database schema is not current: run `gateway migrate`")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ready"}` + "\n"))
}
