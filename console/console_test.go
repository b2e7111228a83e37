package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/console"
	"github.com/oncegate/oncegate/internal/testkit/consoletest"
	"github.com/oncegate/oncegate/internal/testkit/leaktest"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

func TestMain(m *testing.M) { leaktest.Main(m) }

// htmxVersion and htmxSHA256 pin the vendored htmx: `npm pack htmx.org@2.0.11`, dist/htmx.min.js. Updating
// htmx means replacing assets/htmx.min.js from the new release's package and changing both here.
const (
	htmxVersion = "2.0.11"
	htmxSHA256  = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"
)

func TestVendoredHTMXIsThePinnedRelease(t *testing.T) {
	b, err := os.ReadFile("assets/htmx.min.js")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != htmxSHA256 {
		t.Fatalf("assets/htmx.min.js has SHA-256 %s, want %s (htmx.org@%s): vendor it again from npm, do not edit it",
			got, htmxSHA256, htmxVersion)
	}
	if !strings.Contains(string(b), `version:"`+htmxVersion+`"`) {
		t.Fatalf("assets/htmx.min.js does not say it is version %s", htmxVersion)
	}
}

// env is a console over a seeded database and queue, with a token per role.
type env struct {
	t      *testing.T
	url    string
	srv    *console.Server
	db     *pgxpool.Pool
	rdb    *redis.Client
	svc    *admin.Service
	queue  string
	dead   []string
	tokens map[admin.Role]string
}

type options struct {
	readOnly bool
	// secureCookie is console.Config.SecureCookie.
	secureCookie bool
	effects      int
	// queueSuffix is added to the queue's name, deadPrefix (default "receipt-") begins its dead jobs' IDs.
	queueSuffix string
	deadPrefix  string
}

func setup(t *testing.T, o options) *env {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	dbURL := pgtest.Database(t)
	db, err := admin.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	rdb := testenv.Redis(t)
	reg := testenv.Name(t, "registry")
	qname := testenv.Name(t, "receipts") + o.queueSuffix
	q, err := queue.New(rdb, qname, &queue.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = q.Destroy(context.Background())
		rdb.Del(context.Background(), reg)
	})
	if o.effects == 0 {
		o.effects = 3000
	}
	if err := consoletest.Effects(ctx, db, o.effects, 2*time.Hour, "order-"); err != nil {
		t.Fatal(err)
	}
	if err := consoletest.Gateways(ctx, db); err != nil {
		t.Fatal(err)
	}
	if o.deadPrefix == "" {
		o.deadPrefix = "receipt-"
	}
	dead, err := consoletest.DeadJobs(ctx, q, 5, o.deadPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := consoletest.ReadyJobs(ctx, q, 20, "later-"); err != nil {
		t.Fatal(err)
	}
	svc := admin.New(admin.Config{DB: db, Redis: rdb, QueueRegistry: reg, JaegerURL: "http://jaeger.example:16686"})
	e := &env{t: t, db: db, rdb: rdb, svc: svc, queue: qname, dead: dead, tokens: map[admin.Role]string{}}
	boss := admin.Actor{Name: "bootstrap", Role: admin.RoleAdmin}
	for _, r := range admin.Roles() {
		tok, err := svc.CreateToken(ctx, boss, string(r)+"-ann", r)
		if err != nil {
			t.Fatal(err)
		}
		e.tokens[r] = tok
	}
	e.srv, err = console.New(console.Config{Admin: svc, ReadOnly: o.readOnly, SecureCookie: o.secureCookie})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(e.srv.Handler())
	t.Cleanup(func() { hs.Close(); e.srv.Close() })
	e.url = hs.URL
	return e
}

// client is a logged-in browser-like client (cookie jar), not following redirects so tests see them.
func (e *env) client(role admin.Role) *http.Client {
	e.t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.PostForm(e.url+"/login", url.Values{"token": {e.tokens[role]}, "next": {"/"}})
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		e.t.Fatalf("login as %s: %d", role, resp.StatusCode)
	}
	return c
}

func (e *env) get(c *http.Client, path string, hdr ...string) (int, http.Header, string) {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.url+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (e *env) post(c *http.Client, path string, form url.Values, hdr ...string) (int, http.Header, string) {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.url+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// effectWith returns the key and tenant of a seeded effect in status.
func (e *env) effectWith(status string) (tenant, key string) {
	e.t.Helper()
	err := e.db.QueryRow(context.Background(),
		"SELECT tenant, key FROM oncegate_effects WHERE status = $1 ORDER BY id LIMIT 1", status).Scan(&tenant, &key)
	if err != nil {
		e.t.Fatalf("no %s effect seeded: %v", status, err)
	}
	return tenant, key
}

func (e *env) status(tenant, key string) string {
	e.t.Helper()
	var s string
	if err := e.db.QueryRow(context.Background(), "SELECT status FROM oncegate_effects WHERE tenant = $1 AND key = $2",
		tenant, key).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

var (
	inlineScript  = regexp.MustCompile(`(?i)<script(?:\s+[^>]*)?>`)
	eventHandler  = regexp.MustCompile(`(?i)\son[a-z]+\s*=`)
	inlineStyle   = regexp.MustCompile(`(?i)<style|\sstyle\s*=`)
	javascriptURL = regexp.MustCompile(`(?i)javascript:`)
)

// checkPage holds every page to the rules the Content-Security-Policy enforces in a browser, so that a
// template change that would be blocked there fails here first.
func checkPage(t *testing.T, path string, hdr http.Header, body string) {
	t.Helper()
	if got := hdr.Get("Content-Security-Policy"); !strings.Contains(got, "script-src 'self'") ||
		strings.Contains(got, "unsafe-inline") || strings.Contains(got, "unsafe-eval") {
		t.Errorf("%s: Content-Security-Policy %q", path, got)
	}
	for _, tag := range inlineScript.FindAllString(body, -1) {
		if !strings.Contains(tag, "src=") {
			t.Errorf("%s: inline script %s", path, tag)
		}
	}
	for _, bad := range []*regexp.Regexp{eventHandler, inlineStyle, javascriptURL} {
		if m := bad.FindString(body); m != "" {
			t.Errorf("%s: %q is refused by the Content-Security-Policy", path, m)
		}
	}
	if strings.Contains(body, "ZgotmplZ") {
		t.Errorf("%s: html/template refused a value (ZgotmplZ)", path)
	}
}

// Every page and fragment renders with seeded data, to an operator (with actions) and a viewer (without).
func TestEveryPageRenders(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	ctx := context.Background()
	dTenant, dKey := e.effectWith("dead")
	uTenant, uKey := e.effectWith("unknown")
	// Some audit entries to list.
	if _, err := e.svc.RetryEffect(ctx, admin.Actor{Name: "ann", Role: admin.RoleOperator}, dTenant, dKey, "seed"); err != nil {
		t.Fatal(err)
	}
	dTenant, dKey = e.effectWith("dead")
	var jobID, traceID string
	if err := e.db.QueryRow(ctx, "SELECT job_id, trace_id FROM oncegate_effects WHERE tenant = $1 AND key = $2",
		dTenant, dKey).Scan(&jobID, &traceID); err != nil {
		t.Fatal(err)
	}

	type want struct {
		path     string
		contains []string
		hdr      []string
	}
	pages := []want{
		{"/", []string{"Needs a human", e.queue, "email", "webhook", "analytics", "<svg class=\"chart\"",
			"smtp.example.com:587", "gw-1", `id="dead-jobs">5<`, `<td class="held">15 <span class="tenant">acme 12</span>`,
			// gw-0, gone three hours ago, is folded: its open breaker for hooks.globex.example does not
			// add a second row beside gw-1's.
			`id="folded-gateways">1 gateway gone`, `open on 1 of 1`, `half-open on 1 of 1 (gone)`}, nil},
		{"/fragment/home", []string{"Needs a human"}, []string{"HX-Request", "true"}},
		{"/effects", []string{"order-", "Next page"}, nil},
		{"/effects?status=dead&type=webhook&since=3h", []string{"dead"}, nil},
		{"/effects?tenant=acme&key_prefix=order-0-1", []string{"order-0-1"}, nil},
		{"/effects?q=" + url.QueryEscape(jobID), []string{"job " + jobID, "/fragment/effects?job=" + jobID}, nil},
		{"/effects?q=" + traceID, []string{"trace " + traceID, dKey}, nil},
		{"/effects?q=order-0-", []string{"keys starting with"}, nil},
		{"/destinations", []string{"hooks.example.com", "smtp.example.com:587", `class="rate-bar"`, "%"}, nil},
		{"/effects?q=Customer3@Example.com", []string{"tag or recipient", "order-0-3<"}, nil},
		{"/effects?q=receipt-1", []string{`class="found-job"`, "/job?queue=" + e.queue + "&amp;id=receipt-1"}, nil},
		{"/fragment/effects?status=dead", []string{"effect-rows"}, []string{"HX-Request", "true"}},
		{"/effects/retry-matching?status=dead", []string{"dry-run-count"}, nil},
		{"/effect?tenant=" + dTenant + "&key=" + dKey, []string{dKey, "Delivery attempts", "‹string,",
			"http://jaeger.example:16686/trace/", "Replays absorbed", `action="/effect/retry"`}, nil},
		{"/effect?tenant=" + uTenant + "&key=" + uKey, []string{`action="/effect/resolve"`, "in_doubt"}, nil},
		{"/queues", []string{e.queue}, nil},
		{"/queue?name=" + e.queue, []string{"later-1"}, nil},
		{"/queue?name=" + e.queue + "&state=dead", []string{"receipt-1", "receipt template missing", "requeue-selected"}, nil},
		{"/queue?name=" + e.queue + "&state=delayed", []string{"No delayed job"}, nil},
		{"/queue?name=" + e.queue + "&state=active", []string{"No active job"}, nil},
		{"/queue?name=" + e.queue + "&state=completed", []string{"No completed job"}, nil},
		{"/fragment/queue?name=" + e.queue + "&state=dead", []string{"job-rows"}, []string{"HX-Request", "true"}},
		{"/job?queue=" + e.queue + "&id=receipt-1", []string{"receipt-1", "Dead reason", "send-receipt"}, nil},
		{"/audit", []string{"<td>effect.retry</td>", "<td>token.create</td>", "<td>console.login</td>"}, nil},
		{"/audit?actor=ann&action=effect.retry&since=1h", []string{"seed", "<option selected>effect.retry</option>"}, nil},
	}
	admin := e.client("admin")
	for _, p := range pages {
		code, hdr, body := e.get(admin, p.path, p.hdr...)
		if code != http.StatusOK {
			t.Errorf("GET %s: %d\n%s", p.path, code, body)
			continue
		}
		checkPage(t, p.path, hdr, body)
		for _, c := range p.contains {
			if !strings.Contains(body, c) {
				t.Errorf("GET %s: no %q in the page", p.path, c)
			}
		}
	}
	// An exact key in the search box opens the effect.
	code, hdr, _ := e.get(admin, "/effects?q="+url.QueryEscape(dKey))
	if code != http.StatusSeeOther || !strings.Contains(hdr.Get("Location"), "/effect?") {
		t.Errorf("search by key: %d %s", code, hdr.Get("Location"))
	}
	// Errors are pages too.
	for path, st := range map[string]int{"/effect?tenant=acme&key=nope": 404, "/queue?name=nope": 404,
		"/effects?status=bogus": 400, "/effects?since=yesterday": 400, "/queue?name=" + e.queue + "&state=x": 400,
		"/audit?action=efect.retry": 400} {
		code, hdr, body := e.get(admin, path)
		if code != st {
			t.Errorf("GET %s: %d, want %d", path, code, st)
		}
		checkPage(t, path, hdr, body)
	}
	code, hdr, body := e.get(http.DefaultClient, "/login")
	if code != 200 {
		t.Errorf("login page: %d", code)
	}
	checkPage(t, "/login", hdr, body)
	// The reveal, for an operator, shows the payload and is audited.
	code, hdr, body = e.post(admin, "/effect/reveal", url.Values{"tenant": {dTenant}, "key": {dKey}})
	if code != 200 || !strings.Contains(body, "@example.com") {
		t.Errorf("reveal: %d", code)
	}
	checkPage(t, "/effect/reveal", hdr, body)
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = 'effect.reveal'"); n != 1 {
		t.Errorf("reveals audited: %d", n)
	}
}

// A viewer sees everything and no action; a change it posts anyway is refused and audited as denied.
func TestViewerSeesNoActions(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 2000})
	tenant, key := e.effectWith("dead")
	viewer := e.client(admin.RoleViewer)
	for _, path := range []string{"/", "/effects?status=dead", "/effect?tenant=" + tenant + "&key=" + key, "/queues",
		"/queue?name=" + e.queue + "&state=dead", "/job?queue=" + e.queue + "&id=" + e.dead[0]} {
		code, _, body := e.get(viewer, path)
		if code != 200 {
			t.Fatalf("GET %s: %d", path, code)
		}
		for _, action := range []string{`method="post" action="/effect`, `action="/dead/`, `action="/queues/`,
			`action="/types/`, `action="/effects/retry-selected"`, "Retry all matching", "Reveal", `class="sel"`} {
			if strings.Contains(body, action) {
				t.Errorf("a viewer sees %q on %s", action, path)
			}
		}
	}
	code, _, _ := e.post(viewer, "/effect/retry", url.Values{"tenant": {tenant}, "key": {key}, "reason": {"try"}})
	if code != http.StatusForbidden {
		t.Errorf("viewer's retry: %d, want 403", code)
	}
	if s := e.status(tenant, key); s != "dead" {
		t.Errorf("after a viewer's retry the effect is %s", s)
	}
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = 'effect.retry' AND outcome = 'denied'"); n != 1 {
		t.Errorf("denied retries audited: %d", n)
	}
}

// A form posted from another origin is refused whatever cookie it carries; the same form from the console's
// own page goes through.
func TestCrossOriginPostIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 2000})
	tenant, key := e.effectWith("dead")
	op := e.client(admin.RoleOperator)
	form := url.Values{"tenant": {tenant}, "key": {key}, "reason": {"forged"}}
	for _, hdr := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site", "Origin", "http://127.0.0.1:1"},
		{"Origin", "https://evil.example"},
	} {
		code, _, body := e.post(op, "/effect/retry", form, hdr...)
		if code != http.StatusForbidden || !strings.Contains(body, "cross-origin") {
			t.Errorf("forged POST with %v: %d %s", hdr, code, body)
		}
	}
	// To the API, the refusal is a problem, as its other errors are.
	code, hdr, body := e.post(op, "/api/v1/effect/retry", url.Values{}, "Sec-Fetch-Site", "cross-site")
	if code != http.StatusForbidden || hdr.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "cross-origin") {
		t.Errorf("a cross-site POST to the API: %d %s %s", code, hdr.Get("Content-Type"), body)
	}
	if s := e.status(tenant, key); s != "dead" {
		t.Fatalf("a forged POST changed the effect to %s", s)
	}
	code, hdr, _ = e.post(op, "/effect/retry", form, "Sec-Fetch-Site", "same-origin", "Origin", e.url)
	if code != http.StatusSeeOther || !strings.Contains(hdr.Get("Location"), "done=retried") {
		t.Fatalf("same-origin POST: %d %s", code, hdr.Get("Location"))
	}
	if s := e.status(tenant, key); s != "pending" {
		t.Fatalf("after the console's own retry the effect is %s", s)
	}
}

// Login: a wrong token is refused (and audited); a right one sets a session cookie that scripts cannot read
// and other sites cannot send; logout ends it.
func TestLoginSessionLogout(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000})
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	code, _, body := e.post(c, "/login", url.Values{"token": {"ogop_wrong"}})
	if code != http.StatusUnauthorized || !strings.Contains(body, "not a live operator token") {
		t.Fatalf("wrong token: %d", code)
	}
	code, hdr, _ := e.get(c, "/effects")
	if code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/login?next=") {
		t.Fatalf("anonymous /effects: %d %s", code, hdr.Get("Location"))
	}
	code, hdr, _ = e.get(c, "/fragment/home", "HX-Request", "true")
	if code != http.StatusUnauthorized || hdr.Get("HX-Redirect") == "" {
		t.Fatalf("anonymous fragment: %d", code)
	}
	code, hdr, _ = e.post(c, "/login", url.Values{"token": {e.tokens[admin.RoleOperator]}, "next": {"//evil.example/"}})
	if code != http.StatusSeeOther || hdr.Get("Location") != "/" {
		t.Fatalf("login: %d to %q (a next off the console must go to /)", code, hdr.Get("Location"))
	}
	sc := hdr.Get("Set-Cookie")
	for _, attr := range []string{console.CookieName + "=", "HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(sc, attr) {
			t.Errorf("session cookie %q lacks %s", sc, attr)
		}
	}
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_console_sessions"); n != 1 {
		t.Errorf("sessions stored: %d", n)
	}
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = 'console.login' AND outcome LIKE 'denied%'"); n != 1 {
		t.Errorf("failed logins audited: %d", n)
	}
	// Neither the token nor the session is stored in clear.
	cookie := strings.TrimPrefix(strings.Split(sc, ";")[0], console.CookieName+"=")
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_console_sessions WHERE encode(hash, 'escape') LIKE '%' || $1 || '%'", cookie); n != 0 {
		t.Error("the session secret is stored in clear")
	}
	jar, _ := cookiejar.New(nil)
	u, _ := url.Parse(e.url)
	jar.SetCookies(u, []*http.Cookie{{Name: console.CookieName, Value: cookie}})
	c.Jar = jar
	if code, _, _ := e.get(c, "/effects"); code != 200 {
		t.Fatalf("with the session: %d", code)
	}
	if code, _, _ := e.post(c, "/logout", nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	jar.SetCookies(u, []*http.Cookie{{Name: console.CookieName, Value: cookie}})
	if code, _, _ := e.get(c, "/effects"); code != http.StatusSeeOther {
		t.Fatalf("the session still works after logout: %d", code)
	}
	// A revoked token's sessions end with it.
	op := e.client(admin.RoleOperator)
	if _, err := e.svc.RevokeToken(context.Background(), admin.Actor{Name: "boss", Role: admin.RoleAdmin},
		"operator-ann", "left the team"); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := e.get(op, "/"); code != http.StatusSeeOther {
		t.Fatalf("a revoked token's session still works: %d", code)
	}
}

// Read-only: an admin sees no action, and a change posted anyway is refused before it reaches the service.
func TestReadOnlyChangesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, options{readOnly: true, effects: 1000})
	tenant, key := e.effectWith("dead")
	c := e.client(admin.RoleAdmin)
	code, _, body := e.get(c, "/effect?tenant="+tenant+"&key="+key)
	if code != 200 || strings.Contains(body, `action="/effect/retry"`) || !strings.Contains(body, "read-only") {
		t.Fatalf("read-only detail: %d, retry form shown: %v", code, strings.Contains(body, `action="/effect/retry"`))
	}
	for path, form := range map[string]url.Values{
		"/effect/retry":        {"tenant": {tenant}, "key": {key}, "reason": {"r"}},
		"/dead/requeue":        {"queue": {e.queue}, "id": {e.dead[0]}, "reason": {"r"}},
		"/queues/pause":        {"queue": {e.queue}, "reason": {"r"}},
		"/types/pause":         {"type": {"email"}, "reason": {"r"}},
		"/queue/enqueue":       {"queue": {e.queue}, "kind": {"k"}, "payload": {"{}"}, "reason": {"r"}},
		"/api/v1/effect/retry": nil,
	} {
		var code int
		if form == nil {
			code, _, _ = e.apiPost(e.tokens[admin.RoleAdmin], path, map[string]any{"tenant": tenant, "key": key, "reason": "r"})
		} else {
			code, _, _ = e.post(c, path, form)
		}
		if code != http.StatusForbidden {
			t.Errorf("read-only POST %s: %d", path, code)
		}
	}
	if s := e.status(tenant, key); s != "dead" {
		t.Fatalf("read-only console changed the effect to %s", s)
	}
}

// A list's refresh faster than the server's minimum interval is answered 204, which htmx leaves unswapped.
func TestPollsHaveAServerSideMinimumInterval(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 1000})
	c := e.client(admin.RoleViewer)
	code, _, _ := e.get(c, "/fragment/effects", "HX-Request", "true")
	if code != 200 {
		t.Fatalf("first poll: %d", code)
	}
	code, _, _ = e.get(c, "/fragment/effects", "HX-Request", "true")
	if code != http.StatusNoContent {
		t.Fatalf("second poll at once: %d, want 204", code)
	}
	// Another fragment, or another session, is not held back.
	if code, _, _ := e.get(c, "/fragment/home", "HX-Request", "true"); code != 200 {
		t.Fatalf("another fragment: %d", code)
	}
	if code, _, _ := e.get(e.client(admin.RoleViewer), "/fragment/effects", "HX-Request", "true"); code != 200 {
		t.Fatalf("another session: %d", code)
	}
}

func (e *env) apiGet(token, path string) (int, http.Header, string) {
	return e.get(http.DefaultClient, path, "Authorization", "Bearer "+token)
}

func (e *env) apiPost(token, path string, body any) (int, http.Header, string) {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.url+path, strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(out)
}

// The JSON API answers with the service's values, takes a bearer token, and answers errors as problems.
func TestJSONAPI(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 2000})
	tenant, key := e.effectWith("dead")
	op := e.tokens[admin.RoleOperator]

	code, hdr, _ := e.apiGet("", "/api/v1/effects")
	if code != 401 || hdr.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("no token: %d %s", code, hdr.Get("Content-Type"))
	}
	code, _, body := e.apiGet(op, "/api/v1/effects?status=dead&limit=1")
	var page admin.EffectPage
	if code != 200 || json.Unmarshal([]byte(body), &page) != nil || len(page.Effects) != 1 || page.NextCursor == "" {
		t.Fatalf("effects: %d %s", code, body)
	}
	code, _, body = e.apiGet(op, "/api/v1/effect?tenant="+tenant+"&key="+key)
	if code != 200 || strings.Contains(body, "@example.com") || !strings.Contains(body, "attempt_log") {
		t.Fatalf("effect (payload redacted): %d %s", code, body)
	}
	// A GET changes nothing: an <img> on any page the operator visits could otherwise write effect.reveal
	// entries in the operator's name. The reveal is a POST.
	reveals := func() int {
		return pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = 'effect.reveal'")
	}
	before := reveals()
	code, _, body = e.apiGet(op, "/api/v1/effect?tenant="+tenant+"&key="+key+"&reveal=true")
	if code != 400 || strings.Contains(body, "@example.com") || reveals() != before {
		t.Fatalf("a GET that asks to reveal: %d %s, %d reveals audited", code, body, reveals()-before)
	}
	code, _, body = e.apiPost(op, "/api/v1/effect/reveal", map[string]any{"tenant": tenant, "key": key})
	if code != 200 || !strings.Contains(body, "@example.com") || reveals() != before+1 {
		t.Fatalf("effect revealed: %d %s", code, body)
	}
	code, _, body = e.apiPost(op, "/api/v1/effects/retry-matching", map[string]any{"filter": map[string]any{"status": "dead"}})
	if code != 200 || !strings.Contains(body, `"dry_run": true`) {
		t.Fatalf("dry run: %d %s", code, body)
	}
	code, _, body = e.apiPost(op, "/api/v1/effect/retry", map[string]any{"tenant": tenant, "key": key})
	if code != 400 || !strings.Contains(body, `"field":"reason"`) {
		t.Fatalf("retry without a reason: %d %s", code, body)
	}
	code, _, body = e.apiPost(op, "/api/v1/effect/retry", map[string]any{"tenant": tenant, "key": key, "reason": "api"})
	if code != 200 || e.status(tenant, key) != "pending" {
		t.Fatalf("retry: %d %s", code, body)
	}
	code, _, _ = e.apiPost(op, "/api/v1/effect/retry", map[string]any{"tenant": tenant, "key": key, "reason": "again"})
	if code != 409 {
		t.Fatalf("retry of a pending effect: %d, want 409", code)
	}
	code, _, body = e.apiPost(e.tokens[admin.RoleViewer], "/api/v1/dead/requeue",
		map[string]any{"queue": e.queue, "ids": e.dead[:1], "reason": "x"})
	if code != 403 {
		t.Fatalf("viewer requeue: %d %s", code, body)
	}
	code, _, body = e.apiPost(op, "/api/v1/dead/requeue", map[string]any{"queue": e.queue, "ids": e.dead[:2], "reason": "fixed"})
	if code != 200 || !strings.Contains(body, `"applied": 2`) {
		t.Fatalf("requeue: %d %s", code, body)
	}
	for _, path := range []string{"/api/v1/whoami", "/api/v1/overview", "/api/v1/queues", "/api/v1/gateways", "/api/v1/destinations", "/api/v1/tenants",
		"/api/v1/breakers", "/api/v1/types", "/api/v1/audit?action=effect.retry",
		"/api/v1/jobs?queue=" + e.queue + "&state=dead", "/api/v1/job?queue=" + e.queue + "&id=" + e.dead[2],
		"/api/v1/workers?queue=" + e.queue} {
		if code, _, body := e.apiGet(op, path); code != 200 || !json.Valid([]byte(body)) {
			t.Errorf("GET %s: %d %s", path, code, body)
		}
	}
	if code, _, body := e.apiGet(op, "/api/v1/effects?stauts=dead"); code != 400 || !strings.Contains(body, `"field":"stauts"`) {
		t.Errorf("a misspelt filter: %d %s", code, body)
	}
	// A bad body member is named as the body spells it (an outside tester was told "DESTINATION").
	if code, _, body := e.apiPost(op, "/api/v1/destinations/resume", map[string]any{"type": "hook",
		"destination": "not a url", "reason": "r"}); code != 400 || !strings.Contains(body, `"field":"destination"`) {
		t.Errorf("a destination that is no URL: %d %s", code, body)
	}
	// A port past 65535 named another destination, the scheme's port (an outside test).
	if code, _, body := e.apiPost(op, "/api/v1/destinations/resume", map[string]any{"type": "hook",
		"destination": "http://127.0.0.1:99999", "reason": "r"}); code != 400 || !strings.Contains(body, "want 1 to 65535") {
		t.Errorf("a port past 65535: %d %s", code, body)
	}
	// A member of another change's body is refused, not ignored: destinations/resume lifts every tenant's
	// pause, whatever tenant the caller named (an outside test).
	if code, _, body := e.apiPost(op, "/api/v1/destinations/resume", map[string]any{"type": "hook",
		"destination": "http://127.0.0.1:1", "reason": "r", "tenant": "alpha"}); code != 400 ||
		!strings.Contains(body, `"field":"tenant"`) {
		t.Errorf("a tenant named to destinations/resume: %d %s", code, body)
	}
	if code, _, body := e.apiPost(op, "/api/v1/types/pause", map[string]any{"type": "email", "reason": "r",
		"tenant": "alpha"}); code != 400 || !strings.Contains(body, `"field":"tenant"`) {
		t.Errorf("a tenant named to types/pause: %d %s", code, body)
	}
	if code, _, _ := e.apiGet(op, "/api/v1/nope"); code != 404 {
		t.Errorf("unknown route: %d", code)
	}
}

// Retry of all matching: the dry run counts, the run retries them in audited batches and shows its progress.
func TestRetryAllMatching(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 3000})
	c := e.client(admin.RoleOperator)
	want := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_effects WHERE status = 'failed' AND type = 'email'")
	code, _, body := e.get(c, "/effects/retry-matching?status=failed&type=email")
	if code != 200 || !strings.Contains(body, fmt.Sprintf(`id="dry-run-count">%d<`, want)) {
		t.Fatalf("dry run: %d, want count %d", code, want)
	}
	code, hdr, _ := e.post(c, "/effects/retry-matching", url.Values{"status": {"failed"}, "type": {"email"}, "reason": {"smtp fixed"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/bulk/") {
		t.Fatalf("start: %d %s", code, hdr.Get("Location"))
	}
	testenv.Eventually(t, 30*time.Second, "the bulk retry ends", func() bool {
		_, _, body = e.get(c, "/fragment/bulk/"+strings.TrimPrefix(hdr.Get("Location"), "/bulk/"))
		return strings.Contains(body, "bulk-done")
	})
	if !strings.Contains(body, fmt.Sprintf(`id="bulk-applied">%d<`, want)) {
		t.Fatalf("progress: %s", body)
	}
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_effects WHERE status = 'failed' AND type = 'email'"); n != 0 {
		t.Fatalf("%d still failed", n)
	}
	if n := pgtest.Count(t, e.db, "SELECT coalesce(sum(count), 0)::int FROM oncegate_audit WHERE action = 'effect.retry-matching'"); n != want {
		t.Fatalf("audited %d, want %d", n, want)
	}
	// Selected on a page: each retried, the rest untouched.
	tenant, key := e.effectWith("dead")
	v := url.Values{"tenant": {tenant}, "key": {key}}.Encode()
	code, hdr, _ = e.post(c, "/effects/retry-selected", url.Values{"sel": {v}, "reason": {"picked"}, "status": {"dead"}})
	if code != http.StatusSeeOther || !strings.Contains(hdr.Get("Location"), "done=retried") {
		t.Fatalf("retry selected: %d %s", code, hdr.Get("Location"))
	}
	if s := e.status(tenant, key); s != "pending" {
		t.Fatalf("selected effect is %s", s)
	}
}

// Pausing a queue and an effect type through their forms shows them paused, with a resume form, on every page
// that lists them; the bulk-progress page renders; and both are resumed again.
func TestPausedStatesAndBulkPageRender(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 2000})
	c := e.client(admin.RoleOperator)
	for path, form := range map[string]url.Values{
		"/queues/pause": {"queue": {e.queue}, "reason": {"incident 7"}},
		"/types/pause":  {"type": {"webhook"}, "reason": {"provider down"}},
	} {
		if code, _, body := e.post(c, path, form); code != http.StatusSeeOther {
			t.Fatalf("POST %s: %d %s", path, code, body)
		}
	}
	for path, wants := range map[string][]string{
		"/":                      {`badge paused`, `action="/types/resume"`},
		"/queues":                {"incident 7", `action="/queues/resume"`},
		"/queue?name=" + e.queue: {`badge paused`, `dead <small>5</small>`, `ready <small>20</small>`},
	} {
		code, hdr, body := e.get(c, path)
		if code != 200 {
			t.Fatalf("GET %s: %d", path, code)
		}
		checkPage(t, path, hdr, body)
		for _, w := range wants {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: no %q", path, w)
			}
		}
	}
	for path, form := range map[string]url.Values{
		"/queues/resume": {"queue": {e.queue}, "reason": {"over"}},
		"/types/resume":  {"type": {"webhook"}, "reason": {"back"}},
	} {
		if code, _, body := e.post(c, path, form); code != http.StatusSeeOther {
			t.Fatalf("POST %s: %d %s", path, code, body)
		}
	}
	if n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_paused_types"); n != 0 {
		t.Fatalf("%d types still paused", n)
	}
	// Resuming what is not paused is a wrong state, shown as a page.
	code, hdr, body := e.post(c, "/queues/resume", url.Values{"queue": {e.queue}, "reason": {"again"}})
	if code != http.StatusConflict || !strings.Contains(body, "not paused") {
		t.Fatalf("resume twice: %d", code)
	}
	checkPage(t, "/queues/resume", hdr, body)

	code, hdr, _ = e.post(c, "/effects/retry-matching", url.Values{"status": {"dead"}, "reason": {"all"}})
	if code != http.StatusSeeOther {
		t.Fatalf("retry matching: %d", code)
	}
	bulk := hdr.Get("Location")
	testenv.Eventually(t, 30*time.Second, "the bulk retry ends", func() bool {
		_, _, body := e.get(c, "/fragment/bulk/"+strings.TrimPrefix(bulk, "/bulk/"))
		return strings.Contains(body, "bulk-done")
	})
	code, hdr, body = e.get(c, bulk)
	if code != 200 || !strings.Contains(body, `id="bulk-applied">2<`) {
		t.Fatalf("bulk page: %d", code)
	}
	checkPage(t, bulk, hdr, body)
	if code, _, _ := e.get(c, "/bulk/nope"); code != 404 {
		t.Fatalf("unknown bulk run: %d", code)
	}
}

// The queue page enqueues a job, as `oncegate job enqueue` does: the form leads to the new job's page, the
// API answers with its ID, a viewer sees no form and is refused, and a read-only console takes neither.
func TestEnqueueFromTheQueuePage(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 100})
	op := e.client(admin.RoleOperator)
	code, _, body := e.get(op, "/queue?name="+url.QueryEscape(e.queue))
	if code != 200 || !strings.Contains(body, `action="/queue/enqueue"`) {
		t.Fatalf("the queue page has no enqueue form: %d", code)
	}
	code, hdr, _ := e.post(op, "/queue/enqueue", url.Values{"queue": {e.queue}, "kind": {"receipt"}, "id": {"by-hand"},
		"payload": {`{"order":"o-1"}`}, "reason": {"replay o-1"}})
	if code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Location"), "/job?") ||
		!strings.Contains(hdr.Get("Location"), "id=by-hand") {
		t.Fatalf("enqueue form: %d to %q", code, hdr.Get("Location"))
	}
	code, _, body = e.get(op, hdr.Get("Location"))
	if code != 200 || !strings.Contains(body, "Enqueued") || !strings.Contains(body, "by-hand") {
		t.Fatalf("the new job's page: %d", code)
	}
	code, _, body = e.post(op, "/queue/enqueue", url.Values{"queue": {e.queue}, "kind": {"receipt"},
		"payload": {`{order}`}, "reason": {"r"}})
	if code != 400 || !strings.Contains(body, "not JSON") {
		t.Fatalf("a payload that is not JSON: %d", code)
	}

	code, _, body = e.apiPost(e.tokens[admin.RoleOperator], "/api/v1/job/enqueue", map[string]any{"queue": e.queue,
		"job": map[string]any{"kind": "receipt", "payload": map[string]string{"order": "o-2"}}, "delay": "1h",
		"reason": "api"})
	var res admin.Enqueued
	if code != 200 || json.Unmarshal([]byte(body), &res) != nil || res.ID == "" || res.State != queue.StateDelayed {
		t.Fatalf("API enqueue: %d %s", code, body)
	}
	code, _, _ = e.apiPost(e.tokens[admin.RoleViewer], "/api/v1/job/enqueue", map[string]any{"queue": e.queue,
		"job": map[string]any{"kind": "receipt", "payload": map[string]string{}}, "reason": "viewer"})
	if code != 403 {
		t.Fatalf("viewer API enqueue: %d", code)
	}
	if _, _, body := e.get(e.client(admin.RoleViewer), "/queue?name="+url.QueryEscape(e.queue)); strings.Contains(body, `action="/queue/enqueue"`) {
		t.Fatal("a viewer is shown the enqueue form")
	}
	n := pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = 'job.enqueue' AND outcome = 'done'")
	if n != 2 {
		t.Fatalf("%d job.enqueue entries done, want 2", n)
	}
}

// Wrong logins and bearer tokens are throttled per address (an outside tester's finding: nothing slowed
// guessing, and each failed login wrote an audit row): after a few free tries an address is refused unread,
// 429 with Retry-After, with no audit row, until its lockout ends; then a good token works and clears it. A
// wrong token let through is audited, from the form or the API.
func TestWrongTokensAreThrottled(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 100})
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	denied := func() int {
		return pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = 'console.login' AND outcome LIKE 'denied%'")
	}
	var codes []int
	var retry string
	for range 50 {
		code, hdr, _ := e.post(c, "/login", url.Values{"token": {"ogop_guess"}})
		codes = append(codes, code)
		if code == http.StatusTooManyRequests {
			retry = hdr.Get("Retry-After")
		}
	}
	if codes[0] != 401 || codes[len(codes)-1] != http.StatusTooManyRequests || retry == "" {
		t.Fatalf("50 wrong logins answered %v (Retry-After %q)", codes, retry)
	}
	// Five free tries, then lockouts of 1 s, 2 s, 4 s…: a slow machine may see a lockout end mid-loop.
	if n := denied(); n > 9 {
		t.Fatalf("%d failed logins audited: a locked-out address must not write one per try", n)
	}
	// Locked out, even the right token waits: the lockout is the address's.
	if code, _, _ := e.post(c, "/login", url.Values{"token": {e.tokens[admin.RoleOperator]}}); code != http.StatusTooManyRequests {
		t.Fatalf("the right token while locked out: %d", code)
	}
	code, hdr, body := e.apiGet("ogop_guess", "/api/v1/whoami")
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" ||
		hdr.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "try again") {
		t.Fatalf("a wrong bearer token while locked out: %d %v %s", code, hdr, body)
	}
	wait, _ := strconv.Atoi(retry)
	time.Sleep(time.Duration(wait)*time.Second + 100*time.Millisecond)
	code, _, _ = e.post(c, "/login", url.Values{"token": {e.tokens[admin.RoleOperator]}})
	if code != http.StatusSeeOther {
		t.Fatalf("the right token after the lockout: %d", code)
	}
	if code, _, _ := e.apiGet("ogop_guess", "/api/v1/whoami"); code != 401 {
		t.Fatalf("a success clears the address: a wrong token is a 401 again, got %d", code)
	}
	// A wrong bearer token is a failed login too, audited as one, so that guessing through the API shows (an
	// outside tester's eight guesses left no entry); the throttle bounds them as it does the form's.
	api := func() int {
		return pgtest.Count(t, e.db, "SELECT count(*) FROM oncegate_audit WHERE action = 'console.login' AND target = 'api' AND outcome LIKE 'denied%'")
	}
	if n := api(); n != 1 {
		t.Fatalf("%d wrong bearer tokens audited, want the one just sent", n)
	}
	for range 30 {
		e.apiGet("ogop_guess", "/api/v1/whoami")
	}
	if n := api(); n < 2 || n > 10 {
		t.Fatalf("%d of 31 wrong bearer tokens audited: want every one the throttle let through", n)
	}
}

// Behind HTTPS (--secure-cookie) the session cookie is __Host- prefixed: Secure, Path=/, no Domain, so a
// browser sends it over HTTPS only, and no plain-HTTP page (on another port of the host) or other host can
// set or overwrite it.
func TestSecureCookieIsHostPrefixed(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 10, secureCookie: true})
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	code, hdr, _ := e.post(c, "/login", url.Values{"token": {e.tokens[admin.RoleViewer]}})
	sc := hdr.Get("Set-Cookie")
	if code != http.StatusSeeOther || !strings.HasPrefix(sc, console.SecureCookieName+"=") ||
		!strings.Contains(sc, "; Secure") || !strings.Contains(sc, "Path=/") || strings.Contains(sc, "Domain") {
		t.Fatalf("login: %d, Set-Cookie %q", code, sc)
	}
	sess := strings.TrimPrefix(strings.Split(sc, ";")[0], console.SecureCookieName+"=")
	if code, _, _ := e.get(c, "/", "Cookie", console.SecureCookieName+"="+sess); code != 200 {
		t.Fatalf("with the __Host- cookie: %d", code)
	}
	if code, _, _ := e.get(c, "/", "Cookie", console.CookieName+"="+sess); code != http.StatusSeeOther {
		t.Fatalf("the unprefixed name must not be read when the cookie is secure: %d", code)
	}
}

// Issue 31: the Destinations page shows a destination's fleet-wide limit, its rows waiting and its pause, also
// when it had no attempt in the hour, and each tenant's fleet-wide request bucket; the API gives the same.
func TestDestinationsShowLimitsWaitingRowsAndPauses(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 10})
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `
		INSERT INTO oncegate_rate_buckets (type, destination, tat, granted, per_second, burst)
		VALUES ('webhook', 'limited.example', now(), 1, 50, 10);
		INSERT INTO oncegate_destination_pauses (type, destination, until, status, paused_by, paused_at)
		VALUES ('webhook', 'limited.example', now() + interval '5 minutes', 429, 'gw-7', now()),
		       ('webhook', 'over.example', now() - interval '1 minute', 503, 'gw-7', now() - interval '2 minutes');
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'acme', 'lim-' || g, 'webhook', '\x00', '{}', 'eff_lim' || g FROM generate_series(1, 7) g
			RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, tenant, destination) SELECT id, type, tenant, 'limited.example' FROM e;
		INSERT INTO oncegate_tenant_rate_buckets (tenant, tat, granted, per_second, burst, taken)
		VALUES ('acme', now() + interval '1 minute', 5, 25, 40, 12345)`); err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, e.db)
	_, _, body := e.get(e.client(admin.RoleViewer), "/destinations")
	// acme's fleet-wide request bucket is listed beside the destinations: its limit, at its limit (0 left).
	for _, want := range []string{"limited.example", "50/s (burst 10)", ">7<", "(429, by gw-7)", "25/s (burst 40)", ">12345<"} {
		if !strings.Contains(body, want) {
			t.Errorf("the Destinations page lacks %q", want)
		}
	}
	if strings.Contains(body, "over.example") {
		t.Error("a pause that ended, with nothing waiting, is listed")
	}
	_, _, tenants := e.apiGet(e.tokens[admin.RoleViewer], "/api/v1/tenants")
	for _, want := range []string{`"tenant": "acme"`, `"per_second": 25`, `"available": 0`, `"taken": 12345`} {
		if !strings.Contains(tenants, want) {
			t.Errorf("/api/v1/tenants lacks %s: %.400s", want, tenants)
		}
	}
	_, _, api := e.apiGet(e.tokens[admin.RoleViewer], "/api/v1/destinations")
	for _, want := range []string{`"limit_per_second": 50`, `"limit_burst": 10`, `"waiting": 7`, `"paused_status": 429`} {
		if !strings.Contains(api, want) {
			t.Errorf("/api/v1/destinations lacks %s: %.400s", want, api)
		}
	}
}

// Issue 31: a paused destination has a Resume form for an operator (none for a viewer); resuming it, by any
// spelling of its URL, lifts the pause and makes its rows waiting for a retry due; resuming it again is a wrong
// state; the API does the same.
func TestAnOperatorResumesAPausedDestination(t *testing.T) {
	t.Parallel()
	e := setup(t, options{effects: 10})
	ctx := context.Background()
	pause := func() {
		t.Helper()
		if _, err := e.db.Exec(ctx, `
			INSERT INTO oncegate_destination_pauses (type, destination, until, status, paused_by, paused_at)
			VALUES ('webhook', 'https://hooks.example.com:443', now() + interval '50 minutes', 429, 'gw-7', now())`); err != nil {
			t.Fatal(err)
		}
	}
	pause()
	if _, err := e.db.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
			SELECT 'acme', 'paused-' || g, 'webhook', '\x00', '{}', 'eff_paused' || g FROM generate_series(1, 4) g
			RETURNING id, type, tenant)
		INSERT INTO oncegate_outbox (effect_id, type, tenant, destination, run_at)
		SELECT id, type, tenant, 'https://hooks.example.com:443', now() + interval '50 minutes' FROM e`); err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, e.db)
	if _, _, body := e.get(e.client(admin.RoleViewer), "/destinations"); strings.Contains(body, `action="/destinations/resume"`) {
		t.Fatal("a viewer is offered the Resume form")
	}
	c := e.client(admin.RoleOperator)
	code, hdr, body := e.get(c, "/destinations")
	checkPage(t, "/destinations", hdr, body)
	if code != 200 || !strings.Contains(body, `action="/destinations/resume"`) {
		t.Fatalf("GET /destinations as an operator: %d, no Resume form", code)
	}
	form := url.Values{"type": {"webhook"}, "destination": {"HTTPS://Hooks.Example.com/in"}, "reason": {"receiver back"}}
	code, hdr, body = e.post(c, "/destinations/resume", form)
	if code != http.StatusSeeOther || !strings.Contains(hdr.Get("Location"), "done=resumed-destination") {
		t.Fatalf("POST /destinations/resume: %d %s %.300s", code, hdr.Get("Location"), body)
	}
	if n := pgtest.Count(t, e.db, `SELECT count(*) FROM oncegate_destination_pauses WHERE until > now()`); n != 0 {
		t.Fatalf("%d pauses left", n)
	}
	if n := pgtest.Count(t, e.db, `SELECT count(*) FROM oncegate_outbox WHERE destination = 'https://hooks.example.com:443' AND run_at <= now()`); n != 4 {
		t.Fatalf("%d of the 4 rows waiting are due", n)
	}
	_, _, body = e.get(c, "/destinations?done=resumed-destination")
	if !strings.Contains(body, "calls the destination again") {
		t.Error("no notice of the resume")
	}
	code, hdr, body = e.post(c, "/destinations/resume", form)
	if code != http.StatusConflict || !strings.Contains(body, "not paused") {
		t.Fatalf("resume twice: %d", code)
	}
	checkPage(t, "/destinations/resume", hdr, body)

	pause()
	code, _, api := e.apiPost(e.tokens[admin.RoleOperator], "/api/v1/destinations/resume",
		map[string]string{"type": "webhook", "destination": "https://hooks.example.com", "reason": "again back"})
	if code != 200 || !strings.Contains(api, `"destination": "https://hooks.example.com:443"`) {
		t.Fatalf("POST /api/v1/destinations/resume: %d %.300s", code, api)
	}
	code, _, api = e.apiPost(e.tokens[admin.RoleOperator], "/api/v1/destinations/resume",
		map[string]string{"type": "webhook", "destination": "hooks", "reason": "r"})
	if code != http.StatusBadRequest || !strings.Contains(api, "DESTINATION") {
		t.Fatalf("a destination that is no URL: %d %.300s", code, api)
	}
}
