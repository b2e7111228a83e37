package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// The Postgres primary is SIGKILLed under load and its streaming standby promoted; the gateway, given both
// in a multi-host database_url with target_session_attrs=read-write, finds the new primary by itself. With a
// synchronous standby every effect the gateway acknowledged is on the new primary; while there is no primary,
// every request is refused at once with a 503 the client retries, never a 500 and never a hang.
func TestPostgresFailoverToSynchronousStandbyLosesNothing(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Database", "Postgres primary SIGKILLed under 16 clients, its synchronous standby "+
		"promoted; gateway on a multi-host database_url (target_session_attrs=read-write)",
		"0 acknowledged effects missing on the new primary; every request without a primary a 503 with Retry-After within 3 s")
	f := startFailover(t, pgtest.Sync, false)
	if f.readyz.Replication.State != "sync" || f.readyz.Replication.Standbys["sync"] != 1 {
		t.Errorf("readyz reports %+v, want state sync with 1 sync standby", f.readyz.Replication)
	}
	if !strings.Contains(f.metrics, `oncegate_db_standbys{sync_state="sync"} 1`) ||
		!strings.Contains(f.metrics, `oncegate_db_standbys{sync_state="async"} 0`) {
		t.Errorf("metrics do not count the sync standby:\n%s", grepLines(f.metrics, "oncegate_db_standbys"))
	}
	if l := grepLines(f.gateway.Log(), `"replication":`); !strings.Contains(l, `"replication":"sync"`) ||
		strings.Contains(l, `"level":"WARN"`) {
		t.Errorf("the gateway's start does not say its standby is synchronous, or warns: %s", l)
	}
	r := f.run(t, func() {
		// No primary for a while: every request is refused fast with a 503 to retry, problem+json.
		deadline := time.Now().Add(1500 * time.Millisecond)
		for i := 0; time.Now().Before(deadline); i++ {
			for _, path := range []string{"/v1/effects", "/readyz"} {
				body := ""
				if path == "/v1/effects" {
					body = `{"type":"analytics","payload":{"name":"probe"}}`
				}
				start := time.Now()
				code, h, raw := exchange(t, map[bool]string{true: "POST", false: "GET"}[body != ""], f.base+path,
					apiKey, body, fmt.Sprintf("Idempotency-Key: probe-%d", i))
				took := time.Since(start)
				if code != 503 || h.Get("Retry-After") == "" ||
					!strings.HasPrefix(h.Get("Content-Type"), "application/problem+json") || took > 3*time.Second {
					t.Errorf("no primary: %s: %d in %v, Retry-After %q, %s %s", path, code, took,
						h.Get("Retry-After"), h.Get("Content-Type"), raw)
				}
			}
		}
	})
	t.Logf("failover: postgres sync outage=%v acked=%d missing=%d refused=%d", r.outage.Round(100*time.Millisecond),
		r.acked, r.missing, r.refused)
	if r.missing != 0 {
		t.Fatalf("%d of %d acknowledged effects are missing on the promoted synchronous standby", r.missing, r.acked)
	}
	result(fmt.Sprintf("%d acknowledged, 0 missing; outage %v", r.acked, r.outage.Round(100*time.Millisecond)))
}

// The same with an asynchronous standby: the gateway says at start, on /readyz and in its metrics that
// acknowledged effects may be lost on failover, and the loss is measured (it is luck, not asserted). After the
// failover it says that its new primary has no standby.
func TestPostgresFailoverToAsynchronousStandbyIsReported(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Database", "Postgres primary SIGKILLed under 16 clients, its asynchronous standby promoted",
		"the gateway warns at start, on /readyz and in oncegate_db_standbys; the loss is measured, not asserted")
	f := startFailover(t, pgtest.Async, false)
	if f.readyz.Replication.State != "async" || f.readyz.Replication.Standbys["async"] != 1 ||
		!strings.Contains(f.readyz.Replication.Detail, "synchronous_standby_names") {
		t.Errorf("readyz reports %+v, want state async with 1 async standby and what closes it", f.readyz.Replication)
	}
	if !strings.Contains(f.metrics, `oncegate_db_standbys{sync_state="async"} 1`) {
		t.Errorf("metrics do not count the async standby:\n%s", grepLines(f.metrics, "oncegate_db_standbys"))
	}
	if l := grepLines(f.gateway.Log(), `"replication":`); !strings.Contains(l, `"level":"WARN"`) ||
		!strings.Contains(l, `"replication":"async"`) || !strings.Contains(l, "may lose acknowledged effects") ||
		!strings.Contains(l, "set synchronous_standby_names") {
		t.Errorf("no warning at start of the asynchronous standby, what it loses and what closes it: %s", l)
	}
	r := f.run(t, func() { time.Sleep(500 * time.Millisecond) })
	t.Logf("failover: postgres async outage=%v acked=%d missing=%d refused=%d", r.outage.Round(100*time.Millisecond),
		r.acked, r.missing, r.refused)
	result(fmt.Sprintf("%d acknowledged, %d missing (asynchronous: luck); outage %v", r.acked, r.missing,
		r.outage.Round(100*time.Millisecond)))
	// The promoted standby has no standby of its own: the gateway says so, by itself.
	testenv.Eventually(t, 15*time.Second, "the gateway says its new primary has no standby", func() bool {
		return strings.Contains(grepLines(f.gateway.Log(), `"replication":"none"`), `"level":"WARN"`)
	})
}

// The outside tester's set-up: the gateway reaches Postgres through PgBouncer (transaction pooling), which a
// failover tool re-points at the promoted synchronous standby. Every acknowledged effect is there, and the
// gateway answers 503 to retry, never 500, meanwhile.
func TestPostgresFailoverBehindPgBouncerLosesNothing(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Database", "Postgres primary SIGKILLed under 16 clients, its synchronous standby "+
		"promoted and PgBouncer (transaction mode) re-pointed at it", "0 acknowledged effects missing on the new primary; no 500")
	f := startFailover(t, pgtest.Sync, true)
	if f.readyz.Replication.State != "sync" {
		t.Errorf("readyz through PgBouncer reports %+v, want state sync", f.readyz.Replication)
	}
	r := f.run(t, func() { time.Sleep(500 * time.Millisecond) })
	t.Logf("failover: postgres sync via pgbouncer outage=%v acked=%d missing=%d refused=%d",
		r.outage.Round(100*time.Millisecond), r.acked, r.missing, r.refused)
	if r.missing != 0 {
		t.Fatalf("%d of %d acknowledged effects are missing on the promoted synchronous standby", r.missing, r.acked)
	}
	result(fmt.Sprintf("%d acknowledged, 0 missing; outage %v", r.acked, r.outage.Round(100*time.Millisecond)))
}

// A primary that turns read-only under the gateway (demoted, or default_transaction_read_only set by a
// failover tool) refuses its writes with SQLSTATE 25006: that is an outage, answered 503 for the client to
// retry, not an internal error; and the gateway drops the connections that met it, so that once a standby is
// promoted it finds the new primary by itself instead of writing to the read-only server forever.
func TestReadOnlyPrimaryIsAnOutageAndTheGatewayMovesOn(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Database", "The primary turned read-only under the gateway (SQLSTATE 25006), then a standby promoted",
		"every write meanwhile a 503 with Retry-After, never a 500; the gateway writes to, and reads from, the new primary by itself")
	// An API-only gateway: no dispatcher whose writes would meet the read-only server on every pooled
	// connection in turn, and so clear the pool of it, within a second, whatever else the gateway did.
	f := startFailover(t, pgtest.Async, false, ", disabled: true ")
	post := func(key string) (int, http.Header, string) {
		return exchange(t, "POST", f.base+"/v1/effects", apiKey, `{"type":"analytics","payload":{"name":"ro"}}`,
			"Idempotency-Key: "+key)
	}
	// Warm the pool: several connections open on the primary, as under load.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if code, _, raw := post(fmt.Sprintf("warm-%d", i)); code != 202 {
				t.Errorf("warm-%d: %d %s", i, code, raw)
			}
			for range 5 {
				exchange(t, "GET", f.base+"/v1/effects/warm-0", apiKey, "")
			}
		})
	}
	wg.Wait()
	ctx := testenv.Context(t, time.Minute)
	conn, err := pgx.Connect(ctx, f.primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // writable again, for the test database's drop
		_, _ = conn.Exec(context.Background(), "ALTER SYSTEM RESET default_transaction_read_only")
		_, _ = conn.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	// The backends take the reload between transactions; and a pooled connection is checked against
	// target_session_attrs again once it was not for 1 s (gateway/database.go, recheckEvery).
	time.Sleep(1200 * time.Millisecond)
	// A few writes only: most of the warm connections stay on the read-only server, having met nothing yet.
	for i := range 3 {
		start := time.Now()
		code, h, raw := post(fmt.Sprintf("ro-%d", i))
		// The detail names the cause (an outside tester was told the database "did not answer in time", in 8 ms).
		if code != 503 || h.Get("Retry-After") == "" || time.Since(start) > 3*time.Second ||
			!strings.Contains(raw, "the database is read-only") {
			t.Errorf("read-only primary: POST ro-%d: %d in %v, Retry-After %q: %s", i, code, time.Since(start),
				h.Get("Retry-After"), raw)
		}
	}
	// Not ready either: the server answers, and takes no write.
	if code, _, raw := exchange(t, "GET", f.base+"/readyz", "", ""); code != 503 || !strings.Contains(raw, "read-only") {
		t.Errorf("/readyz on a read-only primary: %d %s", code, raw)
	}
	f.standby.Promote()
	promoted := time.Now()
	s, err := pgx.Connect(ctx, pgtest.WithDatabase(f.standby.URL(), f.db))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	// Nor does the gateway read from the demoted server, before any write of its own moved it: an effect
	// changed on the new primary reads as changed. (A connection of the pool that only read since the server
	// turned read-only has met no 25006, and is still on it.)
	if _, err := s.Exec(ctx, "UPDATE oncegate_effects SET attempts = 42 WHERE key = 'warm-0'"); err != nil {
		t.Fatal(err)
	}
	var stale atomic.Int64
	for range 4 {
		wg.Go(func() {
			for range 10 {
				if e := get(t, f.base, "warm-0"); e.Attempts != 42 {
					stale.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := stale.Load(); n != 0 {
		t.Errorf("%d of 40 reads after the promotion came from the demoted server", n)
	}
	testenv.Eventually(t, 15*time.Second, "the gateway writes to the promoted standby", func() bool {
		code, _, _ := post("after-promotion")
		return code == 202 || code == 200
	})
	after := time.Since(promoted).Round(10 * time.Millisecond)
	t.Logf("first write acknowledged %v after the promotion", after)
	var n int
	if err := s.QueryRow(ctx, "SELECT count(*) FROM oncegate_effects WHERE key = 'after-promotion'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the acknowledged effect is not on the promoted standby: %d rows (%v)", n, err)
	}
	result(fmt.Sprintf("3 writes on the read-only primary, 3 503s; 40 reads after, all on the new primary; first write acknowledged %v after the promotion", after))
}

type failover struct {
	primary, standby *pgtest.Cluster
	bouncer          *pgtest.Bouncer // the gateway's way to the primary, if not a multi-host database_url
	db               string          // the database's name, on both
	gateway          *proctest.Proc
	base             string
	readyz           readyzBody
	metrics          string
}

type readyzBody struct {
	Status      string `json:"status"`
	Replication struct {
		State    string         `json:"state"`
		Standbys map[string]int `json:"standbys"`
		Detail   string         `json:"detail"`
	} `json:"replication"`
}

// startFailover starts a primary with a streaming standby of kind r and a gateway on both (multi-host
// database_url, target_session_attrs=read-write), or with bouncer on a PgBouncer in front of the primary,
// which run re-points to the standby once promoted; and reads the gateway's /readyz and /metrics. dispatcher
// is YAML added to the gateway's dispatcher block.
func startFailover(t *testing.T, r pgtest.Replication, bouncer bool, dispatcher ...string) *failover {
	t.Helper()
	f := &failover{primary: pgtest.StartCluster(t)}
	dbURL := pgtest.DatabaseAt(t, f.primary.URL())
	f.db = dbURL[strings.LastIndex(dbURL, "/")+1:]
	if i := strings.IndexByte(f.db, '?'); i >= 0 {
		f.db = f.db[:i]
	}
	f.standby = f.primary.StartStandby(r)
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		f.primary.Port(), f.standby.Port(), f.db)
	if bouncer {
		f.bouncer = pgtest.StartPgBouncer(t, f.primary.URL())
		dsn = f.bouncer.URL(pgtest.WithDatabase(f.primary.URL(), f.db))
	}
	config := writeFile(t, fmt.Sprintf(`listen: 127.0.0.1:0
database_url: %s
tenants: { acme: { api_keys: [%s] } }
effect_types: { analytics: { provider: postgres } }
timeouts: { database: 2s, ready: 2s }
dispatcher: { poll_interval: 200ms, lease_margin: 1s %s}
`, dsn, apiKey, strings.Join(dispatcher, "")))
	f.gateway, f.base = startGateway(t, config)
	code, _, raw := exchange(t, "GET", f.base+"/readyz", "", "")
	if code != 200 {
		t.Fatalf("readyz: %d %s", code, raw)
	}
	if err := json.Unmarshal([]byte(raw), &f.readyz); err != nil {
		t.Fatalf("readyz: %v: %s", err, raw)
	}
	_, _, f.metrics = exchange(t, "GET", f.base+"/metrics", "", "")
	return f
}

type failoverResult struct {
	acked, missing, refused int
	// outage is the longest time, from the kill on, in which no client got a 2xx. (Not the time to the first
	// 2xx after the kill: a SIGKILLed postmaster's backends live on for a moment and may still commit.)
	outage time.Duration
}

// run has 16 clients post analytics effects, each key retried on a 503 or a transport error until a 2xx;
// SIGKILLs the primary once they are going, runs meanwhile (no primary), promotes the standby, lets the load go
// on until a request sent after the promotion got a 2xx, and 1 s more, and counts the acknowledged keys missing there.
func (f *failover) run(t *testing.T, meanwhile func()) failoverResult {
	t.Helper()
	var (
		mu       sync.Mutex
		acked    []string
		refused  atomic.Int64
		okAt     []int64      // unix nanos of each 2xx
		killedAt atomic.Int64 // unix nanos; 0 before the kill
		promoted atomic.Int64 // unix nanos; 0 before the promotion
		okLater  atomic.Bool  // a request sent after the promotion got a 2xx
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	client := &http.Client{Timeout: 10 * time.Second}
	for c := range 16 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("c%d-%d", c, i)
				for !stop.Load() {
					sent := time.Now().UnixNano()
					req, _ := http.NewRequest("POST", f.base+"/v1/effects",
						strings.NewReader(`{"type":"analytics","payload":{"name":"failover"}}`))
					req.Header.Set("Authorization", "Bearer "+apiKey)
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", key)
					resp, err := client.Do(req)
					code := 0
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
					}
					if code == 200 || code == 202 {
						if p := promoted.Load(); p != 0 && sent > p {
							okLater.Store(true)
						}
						mu.Lock()
						acked = append(acked, key)
						okAt = append(okAt, time.Now().UnixNano())
						mu.Unlock()
						break
					}
					if code != 503 && code != 0 {
						t.Errorf("POST %s: %d, want a 2xx or a 503 to retry", key, code)
						return
					}
					refused.Add(1)
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	testenv.Eventually(t, 20*time.Second, "the gateway acknowledges effects", func() bool { return count() >= 300 })
	killedAt.Store(time.Now().UnixNano())
	f.primary.Kill()
	meanwhile()
	f.standby.Promote()
	if f.bouncer != nil {
		f.bouncer.Repoint(f.standby.URL())
	}
	promoted.Store(time.Now().UnixNano())
	testenv.Eventually(t, 20*time.Second, "the gateway acknowledges effects on the promoted standby", okLater.Load)
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()

	ctx := testenv.Context(t, 30*time.Second)
	conn, err := pgx.Connect(ctx, pgtest.WithDatabase(f.standby.URL(), f.db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var missing int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM unnest($1::text[]) AS k WHERE NOT EXISTS "+
		"(SELECT 1 FROM oncegate_effects e WHERE e.key = k)", acked).Scan(&missing); err != nil {
		t.Fatal(err)
	}
	slices.Sort(okAt)
	var outage int64
	last := killedAt.Load()
	for _, at := range okAt {
		if at > last {
			outage = max(outage, at-last)
			last = at
		}
	}
	return failoverResult{acked: len(acked), missing: missing, refused: int(refused.Load()),
		outage: time.Duration(outage)}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A commit that waits for the synchronous standby and is cut short by timeouts.database stays on the primary,
// unreplicated, and its request is a 503. Its retry finds the effect: that replay must not be acknowledged
// until the standby has it (an outside tester got 202 Idempotent-Replayed for 15 such effects, then lost them
// in a failover). With the standby stopped, the retry is a 503 as the first try was; once it is back, the
// retry is a replay, and the effect is on the standby.
func TestAReplayIsAcknowledgedOnlyOnceOnTheSynchronousStandby(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Failover", "Synchronous standby stopped: a create's commit wait cut short "+
		"by timeouts.database (committed on the primary alone), then retried under its key",
		"the retry is a 503 until the standby has the effect; then a replay, and the effect is on the standby")
	f := startFailover(t, pgtest.Sync, false)
	if f.readyz.Replication.State != "sync" {
		t.Fatalf("readyz: %+v", f.readyz)
	}
	f.standby.Stop()
	post := func() int {
		code, _, _ := exchange(t, "POST", f.base+"/v1/effects", apiKey, `{"type":"analytics","payload":{"name":"cut"}}`,
			"Idempotency-Key: cut-short")
		return code
	}
	if code := post(); code != 503 {
		t.Fatalf("a create with the synchronous standby stopped: %d, want 503", code)
	}
	// The first try's commit is on the primary alone now; every retry must say so.
	for i := range 3 {
		if code := post(); code != 503 {
			t.Fatalf("retry %d with the standby stopped: %d, want 503 (a 2xx acknowledges an effect only the primary has)", i, code)
		}
	}
	f.standby.Start()
	testenv.Eventually(t, 30*time.Second, "the retry is acknowledged once the standby is back", func() bool {
		code := post()
		return code == 200 || code == 202
	})
	standby := pgtest.Pool(t, pgtest.WithDatabase(f.standby.URL(), f.db))
	if n := pgtest.Count(t, standby, `SELECT count(*) FROM oncegate_effects WHERE key = 'cut-short'`); n != 1 {
		t.Fatalf("the acknowledged effect is %d times on the standby, want 1", n)
	}
	result("503 while the standby was stopped, a replay once it was back, and the effect on the standby")
}
