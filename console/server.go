// Package console is the operator's web console, the second face of package admin (the `oncegate` CLI is
// the first): server-rendered html/template pages with htmx for partial updates, and a JSON admin API beside
// them, all served from the binary (templates and assets embedded with go:embed; nothing is built with npm).
//
// The guarantees it keeps: it does nothing package admin does not (every change is checked against the
// operator's role and audited there); every form is protected from cross-site requests (Go's
// http.CrossOriginProtection, over a SameSite=Strict, HttpOnly session cookie); no page runs inline script
// (a strict Content-Security-Policy says so to the browser); and with ReadOnly set, nothing changes through
// it at all. Each page reads bounded pages and capped counts, so it answers as fast over a million effects as
// over ten.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/oncegate/oncegate/admin"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed assets
var assetFiles embed.FS

// Defaults of Config.
const (
	// DefaultRefresh is how often a list refreshes itself.
	DefaultRefresh = 5 * time.Second
	// MinRefresh is the least --refresh.
	MinRefresh = 2 * time.Second
	// MaxRefresh is the most: a browser reads a timer past about 24.8 days as none, and polls at once.
	MaxRefresh = time.Hour
	// PollFloor is the least interval between two refreshes of one fragment for one session that the server
	// answers: a faster poll (a script, a page open twice) is answered 204, which htmx leaves unswapped, and
	// costs the stores nothing. Below MinRefresh, so that a browser's timer jitter at the least --refresh
	// never trips it.
	PollFloor = 1500 * time.Millisecond
	// DefaultSessionTTL is how long a console session lasts after login.
	DefaultSessionTTL = 12 * time.Hour
	// CookieName is the session cookie's name over plain HTTP, and SecureCookieName its name with
	// Config.SecureCookie. The __Host- prefix makes a browser refuse the cookie unless it is Secure, has
	// Path=/ and no Domain, so no other host (a sibling subdomain) and no plain-HTTP page can set or
	// overwrite it, and a plain-HTTP server on another port of the same host never receives it.
	CookieName       = "oncegate_console"
	SecureCookieName = "__Host-oncegate_console"
)

// Config is what a console runs on.
type Config struct {
	// Admin is the service layer; the console calls it and nothing else.
	Admin *admin.Service
	// ReadOnly hides every action and refuses every change, whatever the operator's role.
	ReadOnly bool
	// Refresh is how often lists refresh themselves. Defaults to DefaultRefresh; at least MinRefresh.
	Refresh time.Duration
	// SessionTTL defaults to DefaultSessionTTL.
	SessionTTL time.Duration
	// SecureCookie marks the session cookie Secure and names it SecureCookieName: set it when the console is
	// reached over HTTPS (through a proxy, say). Over plain HTTP to 127.0.0.1 a browser would drop it.
	SecureCookie bool
	// RequestTimeout bounds each request's work on the stores. Defaults to DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server serves the console's pages, fragments, assets and JSON API.
type Server struct {
	cfg   Config
	adm   *admin.Service
	log   *slog.Logger
	pages *pages
	bulk  *bulkRuns
	// throttle slows an address that sends wrong tokens (throttle.go).
	throttle *throttle

	mu       sync.Mutex
	lastPoll map[string]time.Time // session hash and fragment path -> when last served

	ctx    context.Context // bulk actions run on it, past the request that started them
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a console server.
func New(cfg Config) (*Server, error) {
	if cfg.Admin == nil {
		return nil, errors.New("console: Config.Admin is required")
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	cfg.Refresh = min(max(cfg.Refresh, MinRefresh), MaxRefresh)
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	p, err := parsePages()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, adm: cfg.Admin, log: cfg.Logger, pages: p, bulk: newBulkRuns(), throttle: newThrottle(),
		lastPoll: map[string]time.Time{}, ctx: ctx, cancel: cancel}, nil
}

// Close stops the bulk actions still running (each stops between two batches, every batch done audited)
// and waits for them.
func (s *Server) Close() {
	s.cancel()
	s.wg.Wait()
}

// Handler returns the console's routes behind its security middleware.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	assets, _ := fs.Sub(assetFiles, "assets")
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", cacheAssets(http.FileServerFS(assets))))

	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.logout)

	page := func(pattern string, h func(http.ResponseWriter, *http.Request, admin.Actor)) {
		mux.Handle(pattern, s.authPage(h))
	}
	page("GET /{$}", s.home)
	page("GET /fragment/home", s.poll(s.homeFragment))
	page("GET /effects", s.effects)
	page("GET /fragment/effects", s.poll(s.effectsFragment))
	page("POST /effects/retry-selected", s.change(s.retrySelected))
	page("GET /effects/retry-matching", s.retryMatchingPreview)
	page("POST /effects/retry-matching", s.change(s.retryMatching))
	page("GET /bulk/{id}", s.bulkPage)
	page("GET /fragment/bulk/{id}", s.bulkFragment)
	page("GET /effect", s.effect)
	page("POST /effect/reveal", s.reveal)
	page("POST /effect/retry", s.change(s.retryEffect))
	page("POST /effect/resolve", s.change(s.resolveEffect))
	page("POST /types/pause", s.change(s.pauseType))
	page("POST /types/resume", s.change(s.resumeType))
	page("GET /destinations", s.destinations)
	page("POST /destinations/resume", s.change(s.resumeDestination))
	page("GET /queues", s.queues)
	page("POST /queues/pause", s.change(s.pauseQueue))
	page("POST /queues/resume", s.change(s.resumeQueue))
	page("GET /queue", s.queuePage)
	page("GET /fragment/queue", s.poll(s.queueFragment))
	page("GET /job", s.job)
	page("POST /job/reveal", s.revealJob)
	page("POST /queue/enqueue", s.change(s.enqueueJob))
	page("POST /dead/requeue", s.change(s.requeueDead))
	page("POST /dead/purge", s.change(s.purgeDead))
	page("GET /audit", s.audit)

	s.apiRoutes(mux)

	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.Warn("console: cross-origin request refused", "method", r.Method, "path", r.URL.Path,
			"origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
		if strings.HasPrefix(r.URL.Path, "/api/") { // the API's errors are problems, this one too
			s.apiFail(w, r, crossOriginError{})
			return
		}
		http.Error(w, crossOriginError{}.Error(), http.StatusForbidden)
	}))
	return securityHeaders(s.bounded(cop.Handler(mux)))
}

// DefaultRequestTimeout is Config.RequestTimeout's default. A database that stops answering mid-query (a
// stalled network, a stuck proxy) ends the request with a 503 instead of holding the operator's page, and
// a connection of the pool, forever. Bulk actions run on the server's own context, batch by batch.
const DefaultRequestTimeout = 30 * time.Second

func (s *Server) bounded(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// r.URL.Query() drops a pair it cannot decode without a word: a filter sent as tenant=ac%zzme would
		// vanish and widen a listing, or a bulk retry's dry run, to every tenant. Such a query is refused.
		if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
			bad := &admin.InvalidError{Field: "query", Reason: "cannot be decoded: " + err.Error()}
			if strings.HasPrefix(r.URL.Path, "/api/") {
				s.apiFail(w, r, bad)
			} else {
				s.fail(w, r, admin.Actor{}, bad)
			}
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// csp allows the console's own script, styles and images and nothing else: no inline script, no inline
// style, no eval (htmx is configured not to need it), no framing, forms posted only to the console.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		if h.Get("Cache-Control") == "" {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

func cacheAssets(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Assets change only with the binary; an hour keeps a restarted console from serving stale ones long.
		w.Header().Set("Cache-Control", "public, max-age=3600")
		next.ServeHTTP(w, r)
	})
}

// poll answers a fragment refresh, unless this session asked for the same fragment less than PollFloor
// ago: then 204, which htmx leaves unswapped.
func (s *Server) poll(h func(http.ResponseWriter, *http.Request, admin.Actor)) func(http.ResponseWriter, *http.Request, admin.Actor) {
	return func(w http.ResponseWriter, r *http.Request, a admin.Actor) {
		if r.Header.Get("HX-Request") == "true" {
			key := s.sessionKey(r) + " " + r.URL.Path
			now := time.Now()
			s.mu.Lock()
			last, seen := s.lastPoll[key]
			early := seen && now.Sub(last) < PollFloor
			if !early {
				s.lastPoll[key] = now
				if len(s.lastPoll) > 10_000 {
					for k, t := range s.lastPoll {
						if now.Sub(t) > time.Minute {
							delete(s.lastPoll, k)
						}
					}
				}
			}
			s.mu.Unlock()
			if early {
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		h(w, r, a)
	}
}

// change refuses every change in read-only mode, before the handler reads anything.
func (s *Server) change(h func(http.ResponseWriter, *http.Request, admin.Actor)) func(http.ResponseWriter, *http.Request, admin.Actor) {
	return func(w http.ResponseWriter, r *http.Request, a admin.Actor) {
		if s.cfg.ReadOnly {
			s.fail(w, r, a, fmt.Errorf("%w: the console runs read-only (--read-only): nothing can be changed through it",
				admin.ErrForbidden))
			return
		}
		h(w, r, a)
	}
}

// crossOriginError is a change a browser sent from another origin, refused whatever the actor's role.
type crossOriginError struct{}

func (crossOriginError) Error() string {
	return "cross-origin request refused: the console takes changes only from its own pages"
}
func (crossOriginError) Is(target error) bool { return target == admin.ErrForbidden }
