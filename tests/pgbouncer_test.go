package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3/lock"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/migrations"
)

// Most production Postgres is reached through PgBouncer in transaction pooling mode, where consecutive
// statements of one client may run on different server connections: no prepared statements (PgBouncer 1.18),
// no session advisory locks, and a LISTEN lands on a pooled connection whose notifications nobody reads.
// These tests run gateways through the PgBouncer that scripts/services starts in that mode (PGBOUNCER_URL).

// bouncerConfig writes a gateway configuration on databaseURL. listenURL, when set, is listen_url; top is
// more top-level YAML.
func bouncerConfig(t *testing.T, databaseURL, listenURL, top string) string {
	t.Helper()
	listen := ""
	if listenURL != "" {
		listen = fmt.Sprintf("listen_url: %q\n", listenURL)
	}
	body := fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %q
%stenants:
  acme:
    api_keys: [%s]
effect_types:
  analytics:
    provider: postgres
%s`, databaseURL, listen, apiKey, top)
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startServe runs `gateway serve` with the configuration and extra flags, and returns it with its base URL.
func startServe(t *testing.T, config string, flags ...string) (*proctest.Proc, string) {
	t.Helper()
	p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), append([]string{"serve", "--config", config}, flags...)...))
	return p, "http://" + strings.TrimPrefix(p.WaitLine("listening ", 60*time.Second), "listening ")
}

// reply is what one request got.
type reply struct {
	status   int
	replayed bool
	effect   effect
	took     time.Duration
	err      error
}

// send posts an analytics effect under key, with wait when not empty; it never fails the test, so that it can
// run in any goroutine.
func send(base, key, wait string) reply {
	body := `{"type":"analytics","payload":{"name":"e"}}`
	if wait != "" {
		body = fmt.Sprintf(`{"type":"analytics","payload":{"name":"e"},"wait":%q}`, wait)
	}
	req, _ := http.NewRequest("POST", base+"/v1/effects", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	a := reply{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	a.err = json.NewDecoder(resp.Body).Decode(&a.effect)
	a.took = time.Since(start)
	return a
}

// percentiles returns the 50th and 90th percentile and the maximum of ds.
func percentiles(ds []time.Duration) (p50, p90, max time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*9/10], s[len(s)-1]
}

// waits sends n effects with wait to base, one after another, and returns how long each took to come back
// delivered. A wait that ran to its deadline, or came back in another state, fails the test.
func waits(t *testing.T, base, prefix string, n int) []time.Duration {
	t.Helper()
	var took []time.Duration
	for i := range n {
		a := send(base, fmt.Sprintf("%s-%d", prefix, i), "20s")
		if a.err != nil || a.status != 200 || a.effect.Status != "delivered" {
			t.Fatalf("wait %d: %d %+v %v", i, a.status, a.effect, a.err)
		}
		if a.took > 15*time.Second {
			t.Fatalf("wait %d ran to its deadline (%v): the waiting gateway never learnt of the delivery", i, a.took)
		}
		took = append(took, a.took)
	}
	return took
}

// metricValue returns the value of series in the gateway's /metrics, or -1 when absent.
func metricValue(t *testing.T, base, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(scrape(t, base), "\n") {
		if strings.HasPrefix(l, series+" ") {
			var v float64
			fmt.Sscan(strings.Fields(l)[1], &v)
			return v
		}
	}
	return -1
}

// Through PgBouncer in transaction mode, without listen_url: creates, replays, 100 concurrent requests on one
// key and deliveries all work, the gateway says at start that notifications are off, and a request waiting on
// the gateway that did not deliver its effect is answered by polling, not at its deadline.
func TestGatewayThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := bouncerConfig(t, pgtest.ThroughPgBouncer(t, dbURL), "", "")
	api, apiBase := startServe(t, config, "--no-dispatch")
	disp, dispBase := startServe(t, config)
	for name, p := range map[string]*proctest.Proc{"API-only": api, "dispatching": disp} {
		testenv.Eventually(t, 10*time.Second, name+" gateway says that notifications are off", func() bool {
			return strings.Contains(p.Log(), "notifications are off")
		})
	}
	if v := metricValue(t, apiBase, "oncegate_notifications_working"); v != 0 {
		t.Fatalf("oncegate_notifications_working %v, want 0", v)
	}

	if a := send(apiBase, "one", ""); a.err != nil || a.status != 202 || a.replayed {
		t.Fatalf("create: %+v", a)
	}
	if a := send(dispBase, "one", ""); a.err != nil || a.status/100 != 2 || !a.replayed {
		t.Fatalf("replay on the other gateway: %+v", a)
	}

	answers := make([]reply, 100)
	var wg sync.WaitGroup
	for i := range answers {
		base := apiBase
		if i%2 == 1 {
			base = dispBase
		}
		wg.Go(func() { answers[i] = send(base, "same", "") })
	}
	wg.Wait()
	created := 0
	for i, a := range answers {
		if a.err != nil || a.status/100 != 2 {
			t.Fatalf("concurrent request %d: %+v", i, a)
		}
		if !a.replayed {
			created++
		}
	}
	if created != 1 {
		t.Fatalf("%d of 100 concurrent requests on one key created an effect, want 1", created)
	}

	took := waits(t, apiBase, "wait", 10)
	p50, p90, max := percentiles(took)
	t.Logf("wait on the API-only gateway, delivered by the other, notifications off: p50 %v, p90 %v, max %v (10 waits)",
		p50.Round(time.Millisecond), p90.Round(time.Millisecond), max.Round(time.Millisecond))
	testenv.Eventually(t, 30*time.Second, "every effect delivered", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status <> 'delivered'") == 0
	})
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events"); n != 12 {
		t.Fatalf("%d analytics rows for 12 effects", n)
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events GROUP BY key ORDER BY 1 DESC LIMIT 1"); n != 1 {
		t.Fatalf("a key delivered %d times", n)
	}
}

// How long a request with "wait" takes to come back delivered when it waits on an API-only gateway and
// another gateway delivers: with listen_url (a direct connection, while queries go through PgBouncer) the
// notifications cross over; without it both gateways poll. The figures are logged, not asserted: the
// machine is shared.
func TestWaitLatencyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	bouncer := pgtest.ThroughPgBouncer(t, dbURL)
	result := reliability.Record(t, "Gateway", "Behind PgBouncer in transaction mode: a wait on the gateway that did not deliver",
		"Answered delivered, never at its deadline, with listen_url and without")
	var figures []string
	for _, c := range []struct{ name, listenURL string }{{"listen_url", dbURL}, {"no-listen_url", ""}} {
		config := bouncerConfig(t, bouncer, c.listenURL, "")
		api, apiBase := startServe(t, config, "--no-dispatch")
		disp, dispBase := startServe(t, config)
		if c.listenURL != "" {
			for _, base := range []string{apiBase, dispBase} {
				testenv.Eventually(t, 20*time.Second, "the notification self-check passes", func() bool {
					return metricValue(t, base, "oncegate_notifications_working") == 1
				})
			}
		}
		waits(t, apiBase, c.name+"-warm", 3)
		p50, p90, max := percentiles(waits(t, apiBase, c.name, 30))
		t.Logf("%s: wait answered after p50 %v, p90 %v, max %v (30 waits)", c.name, p50.Round(time.Millisecond),
			p90.Round(time.Millisecond), max.Round(time.Millisecond))
		figures = append(figures, fmt.Sprintf("%s p50 %v", c.name, p50.Round(time.Millisecond)))
		for _, p := range []*proctest.Proc{api, disp} {
			p.Signal(syscall.SIGTERM)
			if err := p.Wait(30 * time.Second); err != nil {
				t.Fatalf("shutdown: %v\n%s", err, p.Log())
			}
		}
	}
	result(strings.Join(figures, "; "))
}

// listen_url pointed at a transaction-pooling PgBouncer: the LISTEN lands on a pooled server connection and
// its notifications are lost. The start-up self-check notices, says so and counts it, and waits still end.
func TestSelfCheckWarnsWhenNotificationsDoNotArrive(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	bouncer := pgtest.ThroughPgBouncer(t, dbURL)
	config := bouncerConfig(t, bouncer, bouncer, "")
	g, base := startServe(t, config)
	testenv.Eventually(t, 30*time.Second, "the gateway warns that its notification did not arrive", func() bool {
		return strings.Contains(g.Log(), "notification self-check failed")
	})
	if v := metricValue(t, base, "oncegate_notifications_working"); v != 0 {
		t.Fatalf("oncegate_notifications_working %v after a failed self-check", v)
	}
	if v := metricValue(t, base, `oncegate_notification_checks_total{result="lost"}`); v < 1 {
		t.Fatalf("no failed self-check counted: %v", v)
	}
	waits(t, base, "k", 3)
}

// Six gateways start at once on an empty database through PgBouncer, while other clients keep its server
// connections busy: one migrates, the others wait for it or find the schema current, and none hangs.
func TestSixGatewaysStartAtOnceThroughPgBouncer(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "Six gateways started at once on an empty database through PgBouncer (transaction mode), under load",
		"All six serve; each migration applied once")
	dbURL := pgtest.EmptyDatabase(t)
	bouncer := pgtest.ThroughPgBouncer(t, dbURL)
	stopLoad := loadDatabase(t, bouncer, 8)
	defer stopLoad()

	config := bouncerConfig(t, bouncer, "", "")
	start := time.Now()
	procs := make([]*proctest.Proc, 6)
	for i := range procs {
		procs[i] = proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
	}
	bases := make([]string, len(procs))
	for i, p := range procs {
		bases[i] = "http://" + strings.TrimPrefix(p.WaitLine("listening ", 120*time.Second), "listening ")
	}
	took := time.Since(start)
	stopLoad()
	pool := pgtest.Pool(t, dbURL)
	files, _ := filepath.Glob("../migrations/*.sql")
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_schema_migrations WHERE version_id > 0"); n != len(files) {
		t.Fatalf("%d migrations recorded, want each of %d once", n, len(files))
	}
	for i, base := range bases {
		if a := send(base, fmt.Sprintf("g%d", i), "20s"); a.err != nil || a.effect.Status != "delivered" {
			t.Fatalf("gateway %d: %+v", i, a)
		}
	}
	t.Logf("all six serving %v after they were started", took.Round(10*time.Millisecond))
	result(fmt.Sprintf("all six serving after %v; %d migrations applied once", took.Round(100*time.Millisecond), len(files)))
}

// loadDatabase keeps n clients running short transactions on the database at url until the returned
// function is called.
func loadDatabase(t *testing.T, url string, n int) (stop func()) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url+"&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT pg_sleep(0.005)")
					return err
				})
			}
		})
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			pool.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// A gateway SIGKILLed and restarted through PgBouncer while clients keep sending: the restart migrates
// (nothing to do) and serves, and every effect a client was told was accepted is delivered exactly once.
func TestGatewayRestartedUnderLoadThroughPgBouncer(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Gateway", "A gateway SIGKILLed and restarted under load, through PgBouncer (transaction mode)",
		"Restart serves; every accepted effect delivered exactly once")
	dbURL := pgtest.Database(t)
	pool := pgtest.Pool(t, dbURL)
	config := bouncerConfig(t, pgtest.ThroughPgBouncer(t, dbURL), "", "dispatcher: { lease_margin: 1s }\n")
	_, baseA := startServe(t, config)
	b, baseB := startServe(t, config)
	var bases atomic.Pointer[[2]string]
	bases.Store(&[2]string{baseA, baseB})

	var accepted sync.Map
	var sent atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("c%d-%d", c, i)
				// A client retries under the same key until it is answered, on either gateway.
				for attempt := 0; ctx.Err() == nil || attempt == 0; attempt++ {
					a := send(bases.Load()[(i+attempt)%2], key, "")
					if a.err == nil && a.status/100 == 2 {
						accepted.Store(key, true)
						sent.Add(1)
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	testenv.Eventually(t, 30*time.Second, "200 effects accepted before the kill", func() bool { return sent.Load() >= 200 })
	b.Kill()
	atKill := sent.Load()
	_, baseB2 := startServe(t, config)
	bases.Store(&[2]string{baseA, baseB2})
	testenv.Eventually(t, 30*time.Second, "200 more effects accepted after the restart", func() bool {
		return sent.Load() >= atKill+200
	})
	stop()
	wg.Wait()
	n := 0
	accepted.Range(func(any, any) bool { n++; return true })
	testenv.Eventually(t, 60*time.Second, "every accepted effect delivered", func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM oncegate_effects WHERE status = 'delivered'") >= n
	})
	if d := pgtest.Count(t, pool, "SELECT count(*) FROM (SELECT key FROM analytics_events GROUP BY key HAVING count(*) > 1) d"); d != 0 {
		t.Fatalf("%d keys delivered more than once", d)
	}
	accepted.Range(func(k, _ any) bool {
		if c := pgtest.Count(t, pool, "SELECT count(*) FROM analytics_events WHERE key = $1", k); c != 1 {
			t.Fatalf("accepted key %s has %d analytics rows", k, c)
		}
		return true
	})
	result(fmt.Sprintf("%d effects accepted (%d before the kill), all delivered once", n, atKill))
}

// A gateway that cannot take the migration lock within timeouts.migration_lock (another start holds it) says
// so and exits non-zero, instead of hanging.
func TestStartThatCannotTakeTheMigrationLockExits(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.EmptyDatabase(t)
	bouncer := pgtest.ThroughPgBouncer(t, dbURL)
	holder, err := lock.NewPostgresTableLocker(lock.WithTableName(migrations.LockTable), lock.WithTableLockID(migrations.LockID))
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pgtest.Pool(t, dbURL))
	defer db.Close()
	ctx := context.Background()
	if err := holder.Lock(ctx, db); err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(ctx, db) //nolint:errcheck

	config := bouncerConfig(t, bouncer, "", "timeouts: { migration_lock: 3s }\n")
	p := proctest.Start(t, exec.Command(filepath.Join(bin, "gateway"), "serve", "--config", config))
	err = p.Wait(60 * time.Second)
	if err == nil {
		t.Fatalf("the gateway started without the migration lock:\n%s", p.Log())
	}
	if !strings.Contains(p.Log(), "migration lock") {
		t.Fatalf("the gateway did not say why it gave up:\n%s", p.Log())
	}
}

// The pool holds at most pool_max_conns connections, as database_url says, plus the one that listens: the
// connections kept for outcomes (gateway/database.go, outcomeShare) are carved out of it. At 3 there are
// none; at 12, three, used by the webhooks' outcomes.
func TestPoolMaxConnsIsRespected(t *testing.T) {
	t.Parallel()
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(204)
	}))
	t.Cleanup(receiver.Close)
	hook := fmt.Sprintf("  hook:\n    provider: webhook\n    webhook: {url: %q, secret: %q, allow_private_networks: true}\n",
		receiver.URL, "whsec_Y2hhb3Mtd2ViaG9vay1zZWNyZXQtMzItYnl0ZXMh")
	for _, limit := range []int{3, 12} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.Database(t)
			name := dbURL[strings.LastIndex(dbURL, "/")+1 : strings.Index(dbURL, "?")]
			config := bouncerConfig(t, fmt.Sprintf("%s&pool_max_conns=%d", dbURL, limit), "", hook)
			_, base := startServe(t, config)
			admin, err := pgx.Connect(context.Background(), pgtest.AdminURL())
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for c := range 32 {
				wg.Go(func() {
					for i := 0; ctx.Err() == nil; i++ {
						if c%2 == 0 {
							send(base, fmt.Sprintf("c%d-%d", c, i), "")
							continue
						}
						req, _ := http.NewRequest("POST", base+"/v1/effects",
							strings.NewReader(`{"type":"hook","payload":{"event":"e","data":{}}}`))
						req.Header.Set("Authorization", "Bearer "+apiKey)
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Idempotency-Key", fmt.Sprintf("c%d-%d", c, i))
						if resp, err := http.DefaultClient.Do(req); err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							_ = resp.Body.Close()
						}
					}
				})
			}
			most := 0
			for range 100 {
				var n int
				if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name).Scan(&n); err != nil {
					t.Fatal(err)
				}
				most = max(most, n)
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			wg.Wait()
			db, err := pgx.Connect(context.Background(), dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close(context.Background())
			var hooks int
			if err := db.QueryRow(context.Background(), `SELECT count(*) FROM oncegate_effects
				WHERE type = 'hook' AND status = 'delivered'`).Scan(&hooks); err != nil || hooks == 0 {
				t.Fatalf("%d webhooks delivered (%v): the outcome connections were not used", hooks, err)
			}
			t.Logf("at most %d connections to the database under 32 clients, with pool_max_conns=%d; %d webhooks "+
				"delivered", most, limit, hooks)
			if most > limit+1 {
				t.Fatalf("%d connections with pool_max_conns=%d and one listener", most, limit)
			}
		})
	}
}

// A gateway whose pool holds one connection starts on an empty database: the migrations take connections
// of their own, two (one holds the migration lock). It waited forever before, past timeouts.migration_lock.
func TestAPoolOfOneConnectionMigratesAndServes(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.Database(t)
	_, base := startServe(t, bouncerConfig(t, dbURL+"&pool_max_conns=1", "", ""))
	for i := range 20 {
		if r := send(base, fmt.Sprintf("one-%d", i), "5s"); r.err != nil || r.status != 200 {
			t.Fatalf("create %d with wait on a pool of one: %+v", i, r)
		}
	}
}
