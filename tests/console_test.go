package tests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/console"
	"github.com/oncegate/oncegate/internal/testkit/consoletest"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

// chromiumPath finds Debian's chromium (scripts/services installs it). A missing one fails the test: the
// console is only tested if a real browser runs it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: run scripts/services binaries (it installs Debian's chromium package)")
	return ""
}

// browser is a headless Chromium tab that records every console message, exception and browser-log error
// (a Content-Security-Policy violation is one), so that a page the browser refuses to run fails the test.
type browser struct {
	t        *testing.T
	ctx      context.Context
	mu       sync.Mutex
	problems []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, chromedp.WindowSize(1400, 1000), chromedp.Flag("lang", "en-US"))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	b := &browser{t: t, ctx: ctx}
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.Type == chromedp.ConsoleException ||
				strings.Contains(m.Text, "Content Security Policy") {
				b.mu.Lock()
				b.problems = append(b.problems, fmt.Sprintf("%s: %s (%s)", m.Type, m.Text, m.URL))
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc(); <-done })
	return b
}

func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// takeProblems returns what the browser reported since the last call.
func (b *browser) takeProblems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.problems
	b.problems = nil
	return p
}

func (b *browser) noProblems(step string) {
	b.t.Helper()
	for _, p := range b.takeProblems() {
		b.t.Errorf("%s: the browser reported %s", step, p)
	}
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func (b *browser) count(sel string) int {
	b.t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
	if err != nil {
		b.t.Fatalf("count %s: %v", sel, err)
	}
	return n
}

// clickNow clicks the element sel as the page holds it now (a click event, so the page's handlers run).
func (b *browser) clickNow(sel string) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { document.querySelector(%q).click(); return true })()`, sel))); err != nil {
		b.t.Fatalf("click %s: %v", sel, err)
	}
}

// nextPollSkipped waits for the next refresh of the element sel and reports whether it was cancelled. The
// listener is on window, which an event reaches after document, where console.js decides.
func (b *browser) nextPollSkipped(sel string) bool {
	b.t.Helper()
	skipped, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](fmt.Sprintf(`new Promise(resolve => {
		const seen = e => { if (e.detail.elt.matches(%q)) { window.removeEventListener("htmx:beforeRequest", seen); resolve(e.defaultPrevented); } };
		window.addEventListener("htmx:beforeRequest", seen);
	})`, sel), chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("wait for a refresh of %s: %v", sel, err)
	}
	return skipped
}

// screenshot saves the page as a PNG in $CONSOLE_SCREENSHOTS (the README's images: docs/img), when set.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func statusOf(t *testing.T, db *pgxpool.Pool, key string) (status, resolution string) {
	t.Helper()
	var res *string
	if err := db.QueryRow(context.Background(), "SELECT status, resolution FROM oncegate_effects WHERE key = $1",
		key).Scan(&status, &res); err != nil {
		t.Fatal(err)
	}
	if res != nil {
		resolution = *res
	}
	return status, resolution
}

func keyWith(t *testing.T, db *pgxpool.Pool, status string, skip int) string {
	t.Helper()
	var key string
	if err := db.QueryRow(context.Background(), "SELECT key FROM oncegate_effects WHERE status = $1 ORDER BY id OFFSET $2 LIMIT 1",
		status, skip).Scan(&key); err != nil {
		t.Fatal(err)
	}
	return key
}

// The console, run as the `oncegate console` binary and driven through headless Chromium, over a seeded
// database and queue: an operator logs in, finds an effect by key, retries it, resolves an unknown one and
// requeues dead jobs, with the page and the stores checked after each step; a forged cross-origin form is
// refused; a viewer sees no action. No page makes the browser report a script error or a CSP violation.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 4*time.Minute)
	dbURL := pgtest.Database(t)
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	rdb := testenv.Redis(t)
	reg := testenv.Name(t, "registry")
	qname := testenv.Name(t, "receipts")
	q, err := queue.New(rdb, qname, &queue.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Destroy(context.Background()); rdb.Del(context.Background(), reg) })
	if err := consoletest.Effects(ctx, db, 5000, 3*time.Hour, "order-"); err != nil {
		t.Fatal(err)
	}
	if err := consoletest.Gateways(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := consoletest.DeadJobs(ctx, q, 6, "receipt-"); err != nil {
		t.Fatal(err)
	}
	if err := consoletest.ReadyJobs(ctx, q, 40, "nightly-"); err != nil {
		t.Fatal(err)
	}

	env := append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(),
		"ONCEGATE_QUEUE_REGISTRY="+reg, "ONCEGATE_OPERATOR=lead")
	token := func(name, role string) string {
		cmd := exec.Command(filepath.Join(bin, "oncegate"), "token", "create", name, "--role", role)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("oncegate token create %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	opToken, viewerToken := token("ann", "operator"), token("vic", "viewer")
	if n := pgtest.Count(t, db, "SELECT count(*) FROM oncegate_operator_tokens WHERE hash = sha256(convert_to($1, 'UTF8'))", opToken); n != 1 {
		t.Fatalf("the token is not stored as its SHA-256 (%d rows)", n)
	}
	cmd := exec.Command(filepath.Join(bin, "oncegate"), "console", "--listen", "127.0.0.1:0",
		"--jaeger-url", "http://jaeger.example:16686", "--refresh", "2s")
	cmd.Env = env
	p := proctest.Start(t, cmd)
	base := "http://" + strings.TrimPrefix(p.WaitLine("listening ", 30*time.Second), "listening ")

	b := newBrowser(t)

	// Log in: the home page shows what needs a human.
	b.do("log in", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), opToken), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#dead-jobs")))
	if got := b.text("#dead-jobs"); got != "6" {
		t.Fatalf("home: %s dead jobs, want 6", got)
	}
	if got := b.text("#dead-effects"); got != "5" {
		t.Fatalf("home: %s dead effects, want 5", got)
	}
	if b.count("svg.chart polyline") < 9 {
		t.Fatalf("home: %d chart lines, want 3 per effect type", b.count("svg.chart polyline"))
	}
	b.screenshot("console-home")
	b.noProblems("home")

	// The on-call drill: "carol got two emails". Found by her address alone, in any case (no key known);
	// her effect's page shows both sends: the attempt whose gateway died after the server took the message,
	// and the rescue that sent it again.
	if _, err := db.Exec(ctx, `
		WITH e AS (
			INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, status, attempts, created_at,
				updated_at, delivered_at, finished_at, stable_id, tags, search_terms)
			VALUES ('acme', 'welcome:user_6', 'email', '\x00',
				'{"to":["carol@example.test"],"subject":"Welcome, Carol","text":"hi"}', 'delivered', 2,
				now() - interval '3 minutes', now() - interval '2 minutes', now() - interval '2 minutes',
				now() - interval '2 minutes', 'eff_carol', '{customer:6}', '{customer:6,carol@example.test,carol}')
			RETURNING id)
		INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome, error, latency_ms)
		SELECT id, 1, now() - interval '3 minutes', 'gw-1', 'interrupted', 'gateway gw-1 died holding the lease', NULL FROM e
		UNION ALL
		SELECT id, 2, now() - interval '2 minutes', 'gw-2', 'delivered', NULL, 41.5 FROM e`); err != nil {
		t.Fatal(err)
	}
	pgtest.KeyEffects(t, db)
	b.do("search carol", chromedp.SendKeys(chromedp.CSS(`header input[name=q]`), "Carol@Example.test\n"),
		chromedp.WaitVisible(chromedp.CSS("#effect-rows")))
	if body := b.text("main"); !strings.Contains(body, "welcome:user_6") || !strings.Contains(body, "tag or recipient") {
		t.Fatalf("searching carol's address found: %q", body)
	}
	b.do("carol's effect", chromedp.Click(chromedp.CSS(`#effect-rows a[href*="welcome%3Auser_6"]`)),
		chromedp.WaitVisible(chromedp.CSS("#effect-key")))
	if n := b.count(".attempts tbody tr"); n != 2 || !strings.Contains(b.text(".attempts"), "interrupted") {
		t.Fatalf("carol's effect shows %d attempts: %q", n, b.text(".attempts"))
	}
	b.screenshot("console-oncall-carol")
	b.noProblems("on-call search")
	b.do("home again", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#dead-jobs")))

	// Find an effect by its key in the search box, open it, retry it.
	key := keyWith(t, db, "dead", 0)
	b.do("search", chromedp.SendKeys(chromedp.CSS(`header input[name=q]`), key+"\n"),
		chromedp.WaitVisible(chromedp.CSS("#effect-key")))
	if got := b.text("#effect-key"); got != key {
		t.Fatalf("search for %s opened %s", key, got)
	}
	if got := b.text("#effect-status"); got != "dead" {
		t.Fatalf("detail status %s", got)
	}
	if b.count("#trace-link") != 1 || b.count(".attempts tbody tr") != 5 {
		t.Fatalf("detail: trace link %d, attempts %d", b.count("#trace-link"), b.count(".attempts tbody tr"))
	}
	b.screenshot("console-effect")
	b.do("retry", chromedp.SendKeys(chromedp.CSS("#retry-reason"), "smtp relay fixed, INC-2231"),
		chromedp.Click(chromedp.CSS("#retry")), chromedp.WaitVisible(chromedp.CSS(".notice")))
	if got := b.text("#effect-status"); got != "pending" {
		t.Fatalf("after retry the page says %s", got)
	}
	if st, _ := statusOf(t, db, key); st != "pending" {
		t.Fatalf("after retry the database says %s", st)
	}
	if n := pgtest.Count(t, db, "SELECT count(*) FROM oncegate_audit WHERE action = 'effect.retry' AND actor = 'ann' AND reason = 'smtp relay fixed, INC-2231'"); n != 1 {
		t.Fatalf("retry audited %d times", n)
	}
	if n := pgtest.Count(t, db, "SELECT count(*) FROM oncegate_outbox o JOIN oncegate_effects e ON e.id = o.effect_id WHERE e.key = $1", key); n != 1 {
		t.Fatalf("the retried effect has %d outbox rows", n)
	}
	b.noProblems("retry")

	// The list refreshes itself, and skips refreshes while anything is ticked (a refresh would drop the
	// selection). Each check waits for the list's next poll and reads whether console.js cancelled it.
	b.do("effects list", chromedp.Navigate(base+"/effects?status=dead"),
		chromedp.WaitVisible(chromedp.CSS("#effect-rows input.sel")))
	if b.nextPollSkipped("#effect-rows") {
		t.Fatal("a refresh was skipped with nothing ticked")
	}
	// Ticked from a script, in one step: a refresh may swap the rows between finding a node and clicking it.
	b.clickNow("#effect-rows input.sel")
	if !b.nextPollSkipped("#effect-rows") {
		t.Fatal("a refresh ran while an effect was ticked")
	}
	if b.count("#effect-rows input.sel:checked") != 1 {
		t.Fatal("the tick was lost")
	}
	b.clickNow("#effect-rows input.sel")
	if b.nextPollSkipped("#effect-rows") {
		t.Fatal("refreshes stay off after the selection was cleared")
	}
	b.noProblems("refresh")

	// Resolve an unknown effect: it was delivered after all.
	unknown := keyWith(t, db, "unknown", 0)
	b.do("open unknown", chromedp.SendKeys(chromedp.CSS(`header input[name=q]`), unknown+"\n"),
		chromedp.WaitVisible(chromedp.CSS("#resolve")),
		chromedp.Click(chromedp.CSS(`input[name=as][value=delivered]`)),
		chromedp.SendKeys(chromedp.CSS("#resolve-reason"), "provider dashboard shows it sent"),
		chromedp.Click(chromedp.CSS("#resolve")), chromedp.WaitVisible(chromedp.CSS("#resolution")))
	if got := b.text("#effect-status"); got != "delivered" {
		t.Fatalf("after resolve the page says %s", got)
	}
	if got := b.text("#resolution"); !strings.Contains(got, "delivered by ann") || !strings.Contains(got, "provider dashboard shows it sent") {
		t.Fatalf("resolution shown: %q", got)
	}
	if st, res := statusOf(t, db, unknown); st != "delivered" || res != "delivered" {
		t.Fatalf("after resolve the database says %s, resolution %s", st, res)
	}
	b.noProblems("resolve")

	// Requeue every dead job of the queue, selected on the dead-letter list.
	b.do("dead letters", chromedp.Navigate(base+"/queue?name="+qname+"&state=dead"),
		chromedp.WaitVisible(chromedp.CSS("#requeue-selected")))
	if n := b.count("#job-rows tbody input.sel"); n != 6 {
		t.Fatalf("dead-letter list: %d rows to select, want 6", n)
	}
	b.screenshot("console-dead-letters")
	b.do("select all", chromedp.Click(chromedp.CSS(".sel-all")))
	if got := b.text(".bulk .selected"); !strings.HasPrefix(got, "6 selected") {
		t.Fatalf("selection shows %q", got)
	}
	b.do("requeue", chromedp.SendKeys(chromedp.CSS("#dead-reason"), "template fixed in 4.2.1"),
		chromedp.Click(chromedp.CSS("#requeue-selected")), chromedp.WaitVisible(chromedp.CSS(".notice")))
	if got := b.text(".notice"); !strings.HasPrefix(got, "6: Requeued") {
		t.Fatalf("after requeue: %q", got)
	}
	if b.count("#job-rows tbody input.sel") != 0 {
		t.Fatal("the dead-letter list still lists jobs")
	}
	st, err := q.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Counts[queue.StateDead] != 0 || st.Counts[queue.StateReady] != 46 {
		t.Fatalf("after requeue Redis has %v", st.Counts)
	}
	if n := pgtest.Count(t, db, "SELECT count(*) FROM oncegate_audit WHERE action = 'dead.requeue' AND count = 6"); n != 1 {
		t.Fatalf("requeue audited %d times", n)
	}
	b.noProblems("requeue")

	// A form on another origin posts to the console with the operator's cookie (127.0.0.1 on another port is
	// the same site, so SameSite=Strict sends it): refused, and nothing changes.
	victim := keyWith(t, db, "dead", 0)
	var cookieMu sync.Mutex
	var sentCookies []string
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cookieMu.Lock()
		sentCookies = append(sentCookies, r.Header.Get("Cookie"))
		cookieMu.Unlock()
		fmt.Fprintf(w, `<!doctype html><form method="post" action="%s/effect/retry">
<input type="hidden" name="tenant" value="%s"><input type="hidden" name="key" value="%s">
<input type="hidden" name="reason" value="forged"><button id="go" type="submit">Win a prize</button></form>`,
			base, tenantOf(t, db, victim), victim)
	}))
	t.Cleanup(evil.Close)
	b.do("forged post", chromedp.Navigate(evil.URL), chromedp.WaitVisible(chromedp.CSS("#go")),
		// The answer is text/plain, which Chromium shows in a <pre>: the attacker's page has none.
		chromedp.Click(chromedp.CSS("#go")), chromedp.WaitVisible(chromedp.CSS("pre")))
	body := b.text("body")
	if !strings.Contains(body, "cross-origin request refused") {
		t.Fatalf("forged POST answered %q", body)
	}
	if st, _ := statusOf(t, db, victim); st != "dead" {
		t.Fatalf("a forged POST changed the effect to %s", st)
	}
	if n := pgtest.Count(t, db, "SELECT count(*) FROM oncegate_audit WHERE reason = 'forged'"); n != 0 {
		t.Fatal("a forged POST reached the service")
	}
	b.takeProblems() // the 403 is logged by the browser, on purpose

	// What docs/console.md claims of the cookie: a browser scopes it by host, not port, so the page on
	// another port of 127.0.0.1 was sent the session; a server on another loopback address is not.
	cookieMu.Lock()
	leaked := strings.Contains(strings.Join(sentCookies, ";"), console.CookieName+"=")
	sentCookies = nil
	cookieMu.Unlock()
	if !leaked {
		t.Fatalf("the page on another port of 127.0.0.1 was not sent the session cookie: docs/console.md says it is")
	}
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatalf("127.0.0.2 (docs/console.md's advice on Linux): %v", err)
	}
	other := &httptest.Server{Listener: ln, Config: &http.Server{Handler: evil.Config.Handler}}
	other.Start()
	t.Cleanup(other.Close)
	b.do("another loopback address", chromedp.Navigate(other.URL), chromedp.WaitVisible(chromedp.CSS("#go")))
	cookieMu.Lock()
	got := strings.Join(sentCookies, ";")
	cookieMu.Unlock()
	if strings.Contains(got, console.CookieName) {
		t.Fatalf("a server on 127.0.0.2 was sent the console's cookie for 127.0.0.1: %q", got)
	}

	// A viewer: same pages, no action anywhere.
	b.do("log out", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("header form button")),
		chromedp.Click(chromedp.CSS("header form button")), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), viewerToken), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#dead-jobs")))
	if got := b.text(".who .badge"); got != "viewer" {
		t.Fatalf("logged in as %q", got)
	}
	for _, path := range []string{"/", "/effect?tenant=" + tenantOf(t, db, victim) + "&key=" + victim,
		"/effect?tenant=" + tenantOf(t, db, keyWith(t, db, "unknown", 1)) + "&key=" + keyWith(t, db, "unknown", 1),
		"/effects?status=dead", "/queues", "/queue?name=" + qname + "&state=ready"} {
		b.do("viewer "+path, chromedp.Navigate(base+path), chromedp.WaitVisible(chromedp.CSS("main")))
		if n := b.count(`main form[method=post], main input[type=checkbox]`); n != 0 {
			t.Errorf("a viewer sees %d action controls on %s", n, path)
		}
	}
	b.noProblems("viewer")
}

func tenantOf(t *testing.T, db *pgxpool.Pool, key string) string {
	t.Helper()
	var tenant string
	if err := db.QueryRow(context.Background(), "SELECT tenant FROM oncegate_effects WHERE key = $1", key).Scan(&tenant); err != nil {
		t.Fatal(err)
	}
	return tenant
}
