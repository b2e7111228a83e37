package gateway

// The routes: the API under /v1, the probes, /metrics, the OpenAPI document and the problem pages, and the
// 404 and 405 answers.

import (
	"context"
	"database/sql"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/migrations"
	"github.com/oncegate/oncegate/partitions"
)

//go:embed openapi.yaml
var openAPI []byte

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
	if g.cfg == nil || g.cfg.MetricsListen == "" {
		// With metrics_listen set these are served there only: /readyz's body tells the database's replication.
		g.probes(r)
	}
	r.HandleFunc("/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(openAPI)
	}).Methods(get...)
	r.HandleFunc(problemsPath+"{name}", problemPage).Methods(get...)

	// The API's routes sit on the root router, each wrapped, rather than on a "/v1" subrouter: a subrouter's
	// routes repeat its prefix matcher, whose match erases a sibling route's method mismatch, so a wrong
	// method on a /v1 path came out as a 404.
	v1 := func(h http.HandlerFunc) http.Handler { return g.authenticate(g.limitTenant(h)) }
	r.Handle("/v1/effects", v1(g.api(g.createEffect))).Methods(http.MethodPost)
	r.Handle("/v1/effects", v1(g.api(g.listEffects))).Methods(get...)
	r.Handle("/v1/effects/{key}", v1(g.api(g.getEffect))).Methods(get...)
	r.Handle("/v1/effects/{key}/retry", v1(g.api(g.retryEffect))).Methods(http.MethodPost)
	// The dedup proxy takes every method; its key header is its own (proxy.api_key_header).
	proxied := g.authenticateBy(g.proxyKeyHeader(), g.limitTenant(g.api(g.proxy)))
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

// metricsRoutes are metrics_listen's: /metrics, and the probes, so that a probe need not reach the API's
// address either.
func (g *Gateway) metricsRoutes() http.Handler {
	r := mux.NewRouter()
	g.probes(r)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		refuseUnread(w, req, probNotFound, "no such route: this address serves /metrics, /healthz and /readyz")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		refuseUnread(w, req, probMethodNotAllowed, fmt.Sprintf("%s is not a method of this path", req.Method))
	})
	return g.recoverer(r)
}

// probes serves /healthz, /readyz and /metrics on r.
func (g *Gateway) probes(r *mux.Router) {
	get := []string{http.MethodGet, http.MethodHead}
	r.HandleFunc("/healthz", g.healthz).Methods(get...)
	r.HandleFunc("/readyz", g.readyz).Methods(get...)
	r.Handle("/metrics", promhttp.HandlerFor(g.registry, promhttp.HandlerOpts{})).Methods(get...)
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

// readyz is ready when the database answers, takes writes, and its schema has every migration this binary
// knows. Its body
// also reports the database's replication (replication.go), which never makes it unready: a gateway without
// a synchronous standby serves, and says what a failover would lose.
func (g *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.cfg.Timeouts.Ready))
	defer cancel()
	if err := g.pool.Ping(ctx); err != nil {
		w.Header().Set("Retry-After", "1")
		detail := "the database cannot be reached"
		if dedup.NoPrimary(err) {
			detail = "the database is read-only: no server reached takes writes (a failover in progress, or " +
				"default_transaction_read_only on)"
		}
		writeProblem(w, probUnavailable, "", detail)
		return
	}
	// A server that answers but takes no writes (default_transaction_read_only set by a failover tool, or a
	// standby reached without target_session_attrs) refuses every create: the gateway is not ready, though
	// the ping went through (an outside tester's load balancer kept sending it writes that were all 503s).
	var readOnly string
	if err := g.pool.QueryRow(ctx, "SELECT current_setting('transaction_read_only')").Scan(&readOnly); err == nil &&
		readOnly == "on" {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, probUnavailable, "", "the database is read-only: the server reached takes no writes (a "+
			"failover in progress, a standby, or default_transaction_read_only on)")
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
	// A gateway with no partition for the present cannot create an effect: no partition manager ran ahead
	// (behind a transaction pooler with neither ddl_url nor listen_url, or partitions.disabled and nothing
	// else making them).
	if ok, err := partitions.Covers(ctx, g.pool, partitions.Effects, time.Now()); err != nil || !ok {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, probUnavailable, "", "no partition of oncegate_effects covers the present: effects cannot "+
			"be created. Is a partition manager running (ddl_url, docs/storage.md)?")
		return
	}
	body := struct {
		Status      string       `json:"status"`
		Replication *Replication `json:"replication"`
	}{Status: "ready"}
	if r, err := g.replication(ctx); err == nil {
		body.Replication = &r
	} else {
		body.Replication = &Replication{State: ReplicationUnknown, Standbys: map[string]int{},
			Detail: "the replication check failed: " + err.Error()}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}
