package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/console"
	"github.com/oncegate/oncegate/internal/testkit/consoletest"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

// BenchmarkPages seeds 1,000,000 effects (ONCEGATE_BENCH_EFFECTS=10000000 for ten million; created over 30 days, so the home page's last hour holds about
// 1,400; statuses as consoletest.Effects mixes them, with their attempts and replays) and 1,000,000 jobs (a
// million ready, 50 dead made by a worker), then times every page of the console as a browser asks for it:
// one HTTP GET through the whole handler (session check, service calls, template), answered in full. The
// target is under 200 ms a page.
//
//	go test ./console -run '^$' -bench Pages -benchtime 20x
//	ONCEGATE_BENCH_EFFECTS=10000000 go test ./console -run '^$' -bench Pages -benchtime 20x -timeout 2h
func BenchmarkPages(b *testing.B) {
	ctx := context.Background()
	dbURL := pgtest.Database(b)
	db, err := admin.Connect(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	rdb := testenv.Redis(b)
	reg := testenv.Name(b, "registry")
	defer rdb.Del(context.Background(), reg)
	qname := testenv.Name(b, "orders")
	q, err := queue.New(rdb, qname, &queue.Options{Registry: reg})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Destroy(context.Background()) //nolint:errcheck

	start := time.Now()
	effects := testenv.BenchEffects(b, 1_000_000)
	// Seeded through a pool of its own: the admin pool's statement timeout is for an operator's query, and
	// the rollup of ten million effects' attempts takes longer.
	seed := pgtest.Pool(b, dbURL)
	// In daily partitions, as 30 days of retention leave them.
	pgtest.Repartition(b, dbURL, 24*time.Hour, start.Add(-31*24*time.Hour))
	if err := consoletest.Effects(ctx, seed, effects, 30*24*time.Hour, "order-"); err != nil {
		b.Fatal(err)
	}
	if err := consoletest.Gateways(ctx, seed); err != nil {
		b.Fatal(err)
	}
	if _, err := seed.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		b.Fatal(err)
	}
	seededEffects := time.Since(start)
	start = time.Now()
	dead, err := consoletest.DeadJobs(ctx, q, 50, "receipt-")
	if err != nil {
		b.Fatal(err)
	}
	if err := consoletest.ReadyJobs(ctx, q, 1_000_000-50, "order-job-"); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d effects in %v and 1,000,000 jobs in %v", effects, seededEffects.Round(time.Second),
		time.Since(start).Round(time.Second))

	svc := admin.New(admin.Config{DB: db, Redis: rdb, QueueRegistry: reg, JaegerURL: "http://127.0.0.1:16686"})
	tok, err := svc.CreateToken(ctx, admin.Actor{Name: "bench", Role: admin.RoleAdmin}, "bench", admin.RoleOperator)
	if err != nil {
		b.Fatal(err)
	}
	srv, err := console.New(console.Config{Admin: svc})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.PostForm(hs.URL+"/login", url.Values{"token": {tok}})
	if err != nil || resp.StatusCode != http.StatusSeeOther {
		b.Fatalf("login: %v %v", resp, err)
	}
	resp.Body.Close()

	var tenant, key, jobID, traceID string
	if err := db.QueryRow(ctx, "SELECT tenant, key, job_id, trace_id FROM oncegate_effects WHERE status = 'dead' ORDER BY id DESC LIMIT 1 OFFSET 500").
		Scan(&tenant, &key, &jobID, &traceID); err != nil {
		b.Fatal(err)
	}
	// The fourth page of dead effects, by the cursor the third gave.
	deep := "/effects?status=dead"
	for range 3 {
		p, err := svc.Effects(ctx, admin.Actor{Name: "bench", Role: admin.RoleViewer},
			admin.EffectFilter{Status: "dead"}, admin.Page{Cursor: cursorOf(deep)})
		if err != nil {
			b.Fatal(err)
		}
		deep = "/effects?status=dead&cursor=" + p.NextCursor
	}
	pages := []struct{ name, path string }{
		{"home", "/"},
		{"effects", "/effects"},
		{"effects/status=dead", "/effects?status=dead"},
		{"effects/status=dead,page=4", deep},
		{"effects/type=email,status=unknown", "/effects?type=email&status=unknown"},
		{"effects/tenant=acme,status=failed", "/effects?tenant=acme&status=failed"},
		{"effects/since=1h,status=dead", "/effects?since=1h&status=dead"},
		{"effects/key-prefix", "/effects?key_prefix=order-5-1234"},
		{"effects/search=key", "/effects?q=" + url.QueryEscape(key)},
		{"effects/search=job", "/effects?q=" + url.QueryEscape(jobID)},
		{"effects/search=trace", "/effects?q=" + traceID},
		{"effect", "/effect?tenant=" + tenant + "&key=" + url.QueryEscape(key)},
		{"retry-matching/dry-run,status=dead", "/effects/retry-matching?status=dead"},
		{"retry-matching/dry-run,type=webhook", "/effects/retry-matching?type=webhook"},
		{"queues", "/queues"},
		{"queue/ready", "/queue?name=" + qname + "&state=ready"},
		{"queue/dead", "/queue?name=" + qname + "&state=dead"},
		{"job", "/job?queue=" + qname + "&id=" + dead[10]},
		{"job/ready", "/job?queue=" + qname + "&id=order-job-777777"},
		{"audit", "/audit"},
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			var size int
			for b.Loop() {
				resp, err := c.Get(hs.URL + p.path)
				if err != nil {
					b.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusSeeOther {
					b.Fatalf("GET %s: %d %s", p.path, resp.StatusCode, body)
				}
				size = len(body)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
			b.ReportMetric(float64(size), "bytes/page")
		})
	}
}

func cursorOf(path string) string {
	u, _ := url.Parse(path)
	return u.Query().Get("cursor")
}
