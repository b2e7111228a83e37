package admin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/admin"
	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/queue"
)

// BenchmarkOperatorListings seeds 1,000,000 effects (ONCEGATE_BENCH_EFFECTS=10000000 for ten million) (20 tenants, 4 types, statuses as a busy production
// table has them: mostly delivered, a few percent failed, dead, unknown or pending) and 1,000,000 jobs in
// Redis (one queue of a million ready jobs beside nine small ones), then times what an operator runs: pages
// of `effect ls` under each filter, a page deep into the table (by cursor), and `queue ls`. Each op is one
// call of the service, as the CLI and the console make it. The target is under 200 ms an op.
//
//	go test ./admin -run '^$' -bench OperatorListings -benchtime 20x
//	ONCEGATE_BENCH_EFFECTS=10000000 go test ./admin -run '^$' -bench OperatorListings -benchtime 20x -timeout 2h
func BenchmarkOperatorListings(b *testing.B) {
	ctx := context.Background()
	url := pgtest.Database(b)
	pool, err := admin.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	rdb := testenv.Redis(b)
	registry := testenv.Name(b, "registry")
	defer rdb.Del(context.Background(), registry)
	svc := admin.New(admin.Config{DB: pool, Redis: rdb, QueueRegistry: registry})
	viewer := admin.Actor{Name: "bench", Role: admin.RoleViewer}

	start := time.Now()
	effects := testenv.BenchEffects(b, 1_000_000)
	// Tenant by i % 20, type by i / 20 % 4 (so every tenant has every type), status by a hash of i into 100:
	// 0 unknown, 1-2 dead, 3-5 failed, 6 pending, the rest delivered. Created evenly over the 30 days back from
	// now, each with an id telling its second (as oncegate_next_effect_id draws it), in daily partitions, as 30
	// days of retention leave them: --since 1h is the newest 1/720th.
	// Seeded through a pool of its own: the admin pool's statement timeout is for an operator's query, and a
	// million rows with their indexes take longer.
	// In slices of a million rows: one statement of ten million holds its snapshot and its WAL for as long.
	seed := pgtest.Pool(b, url)
	pgtest.Repartition(b, url, 24*time.Hour, start.Add(-31*24*time.Hour))
	spacing := (30 * 24 * time.Hour).Seconds() / float64(effects)
	for from := 1; from <= effects; from += 1_000_000 {
		if _, err := seed.Exec(ctx, `
		INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload, status, attempts, created_at,
			updated_at, finished_at, stable_id, job_id, job_epoch, last_error, tags, search_terms)
		SELECT oncegate_effect_id_at(c) + i % 4194304, 'tenant' || (i % 20), 'order:' || i, (ARRAY['welcome-email', 'order-webhook', 'clicks', 'payments'])[1 + i / 20 % 4],
			'\x00', '{}'::json, s.status, CASE WHEN s.status IN ('dead', 'failed') THEN 3 ELSE 0 END,
			c, c,
			CASE WHEN s.status <> 'pending' THEN now() END, 'eff_' || i, 'job-' || (i / 2), 1,
			CASE WHEN s.status IN ('dead', 'failed', 'unknown') THEN 'destination said no' END,
			CASE WHEN i % 2 = 0 THEN ARRAY['order-' || (i / 4)] END,
			-- Emails (a quarter) are found by their recipient, one of 50,000 customers, and its local part;
			-- half the effects carry a tag naming their order, two effects an order.
			NULLIF(CASE WHEN i / 20 % 4 = 0 THEN ARRAY['customer' || (i % 50000) || '@example.com', 'customer' || (i % 50000)]
			     ELSE ARRAY[]::text[] END || CASE WHEN i % 2 = 0 THEN ARRAY['order-' || (i / 4)] ELSE ARRAY[]::text[] END, '{}')
		FROM generate_series($2::int, $3::int) AS i,
		LATERAL (SELECT now() - make_interval(secs => ($1 - i) * $4::float8) AS c) t,
		LATERAL (SELECT abs(hashint8(i::bigint)::bigint) % 100 AS h) x,
		LATERAL (SELECT CASE WHEN h = 0 THEN 'unknown' WHEN h <= 2 THEN 'dead' WHEN h <= 5 THEN 'failed'
		                     WHEN h = 6 THEN 'pending' ELSE 'delivered' END AS status) s`, effects, from,
			min(from+1_000_000-1, effects), spacing); err != nil {
			b.Fatal(err)
		}
	}
	pgtest.KeyEffects(b, seed)
	if _, err := seed.Exec(ctx, "VACUUM ANALYZE oncegate_effects"); err != nil {
		b.Fatal(err)
	}
	seeded := time.Since(start)

	start = time.Now()
	big, err := queue.New(rdb, testenv.Name(b, "big"), &queue.Options{Registry: registry})
	if err != nil {
		b.Fatal(err)
	}
	defer big.Destroy(context.Background()) //nolint:errcheck
	const jobs = 1_000_000
	batch := make([]queue.NewJob, 0, 10_000)
	for i := range jobs - 9*100 {
		batch = append(batch, queue.NewJob{ID: fmt.Sprintf("job-%d", i), Kind: "order", Payload: []byte(`{"order_id":"o1"}`)})
		if len(batch) == cap(batch) {
			if _, err := big.EnqueueMany(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if _, err := big.EnqueueMany(ctx, batch); err != nil {
		b.Fatal(err)
	}
	for n := range 9 {
		q, _ := queue.New(rdb, testenv.Name(b, fmt.Sprintf("small%d", n)), &queue.Options{Registry: registry})
		defer q.Destroy(context.Background()) //nolint:errcheck
		jb := make([]queue.NewJob, 100)
		if _, err := q.EnqueueMany(ctx, jb); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d effects in %v and %d jobs in %v", effects, seeded.Round(time.Millisecond), jobs,
		time.Since(start).Round(time.Millisecond))

	// A cursor half-way down the table: a page there is as cheap as the first.
	deep := admin.Page{Limit: 50}
	for range 3 {
		p, err := svc.Effects(ctx, viewer, admin.EffectFilter{Status: effect.StatusDead}, deep)
		if err != nil {
			b.Fatal(err)
		}
		deep.Cursor = p.NextCursor
	}
	hourAgo := time.Now().Add(-time.Hour)
	cases := []struct {
		name string
		f    admin.EffectFilter
		p    admin.Page
	}{
		{"effect_ls/all", admin.EffectFilter{}, admin.Page{}},
		{"effect_ls/status=dead", admin.EffectFilter{Status: effect.StatusDead}, admin.Page{}},
		{"effect_ls/status=unknown", admin.EffectFilter{Status: effect.StatusUnknown}, admin.Page{}},
		{"effect_ls/status=dead,page=4", admin.EffectFilter{Status: effect.StatusDead}, deep},
		{"effect_ls/type=order-webhook,status=dead", admin.EffectFilter{Type: "order-webhook", Status: effect.StatusDead}, admin.Page{}},
		{"effect_ls/tenant=tenant7,status=failed", admin.EffectFilter{Tenant: "tenant7", Status: effect.StatusFailed}, admin.Page{}},
		{"effect_ls/tenant=tenant7,type=clicks", admin.EffectFilter{Tenant: "tenant7", Type: "clicks"}, admin.Page{}},
		{"effect_ls/tenant=tenant7,type=clicks,status=unknown", admin.EffectFilter{Tenant: "tenant7", Type: "clicks", Status: effect.StatusUnknown}, admin.Page{}},
		// The worst case of a filter that the indexes serve only in part: a tenant's pending effects, 1% of its
		// 50,000, found by walking its (tenant, id) index from the newest.
		{"effect_ls/tenant=tenant7,status=pending", admin.EffectFilter{Tenant: "tenant7", Status: effect.StatusPending}, admin.Page{}},
		{"effect_ls/key-prefix=order:4242", admin.EffectFilter{KeyPrefix: "order:4242"}, admin.Page{}},
		{"effect_ls/since=1h,status=unknown", admin.EffectFilter{Since: hourAgo, Status: effect.StatusUnknown}, admin.Page{}},
		{"effect_ls/job=job-123456", admin.EffectFilter{JobID: "job-123456"}, admin.Page{}},
		{"effect_ls/status=dead,limit=1000", admin.EffectFilter{Status: effect.StatusDead}, admin.Page{Limit: 1000}},
		// --search: by a recipient's address (any case), its local part, a tag, and a key, each through the
		// GIN index on search_terms or'd with the key's.
		{"effect_ls/search=address", admin.EffectFilter{Search: "Customer4242@Example.com"}, admin.Page{}},
		{"effect_ls/search=local-part", admin.EffectFilter{Search: "customer4242"}, admin.Page{}},
		{"effect_ls/search=tag", admin.EffectFilter{Search: "order-4242"}, admin.Page{}},
		{"effect_ls/search=key", admin.EffectFilter{Search: "order:777777"}, admin.Page{}},
		{"effect_ls/search=address,status=delivered", admin.EffectFilter{Search: "customer4242@example.com", Status: effect.StatusDelivered}, admin.Page{}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var n int
			for b.Loop() {
				p, err := svc.Effects(ctx, viewer, c.f, c.p)
				if err != nil {
					b.Fatal(err)
				}
				n = len(p.Effects)
			}
			b.ReportMetric(float64(n), "effects/op")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
		})
	}
	b.Run("effect_show", func(b *testing.B) {
		for b.Loop() {
			if _, err := svc.Effect(ctx, viewer, "", "order:777777"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
	})
	b.Run("queue_ls", func(b *testing.B) {
		var qs []admin.Queue
		for b.Loop() {
			if qs, err = svc.Queues(ctx, viewer); err != nil {
				b.Fatal(err)
			}
		}
		var total int64
		for _, q := range qs {
			total += q.Counts[queue.StateReady]
		}
		b.ReportMetric(float64(len(qs)), "queues/op")
		b.ReportMetric(float64(total), "jobs")
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
	})
}

// BenchmarkDestinationRates seeds two hours of the destinations' per-minute rollup, 4 types × 40 destinations
// (what a busy fleet's attempt logs write, however many millions of attempts that is), and times the
// Destinations page's one query. The target is under 200 ms an op, as for every operator listing. (Reading the
// attempts themselves took 445 ms for half a million in the hour.)
//
//	go test ./admin -run '^$' -bench DestinationRates -benchtime 10x
func BenchmarkDestinationRates(b *testing.B) {
	ctx := context.Background()
	url := pgtest.Database(b)
	pool, err := admin.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	seed := pgtest.Pool(b, url)
	if _, err := seed.Exec(ctx, `
		INSERT INTO oncegate_destination_minutes (minute, type, destination, attempts, delivered, failed, retried,
			in_doubt, latency_buckets)
		SELECT date_trunc('minute', now()) - make_interval(mins => m), t, 'dest' || d || '.example', 3000, 2900, 30,
		       60, 10, ARRAY[0, 0, 5, 40, 300, 1500, 900, 200, 40, 10, 3, 1, 1, 0, 0, 0]::bigint[]
		FROM generate_series(0, 119) AS m, unnest(ARRAY['welcome-email', 'order-webhook', 'clicks', 'payments']) AS t,
		     generate_series(1, 40) AS d`); err != nil {
		b.Fatal(err)
	}
	if _, err := seed.Exec(ctx, "VACUUM ANALYZE oncegate_destination_minutes"); err != nil {
		b.Fatal(err)
	}
	svc := admin.New(admin.Config{DB: pool})
	viewer := admin.Actor{Name: "bench", Role: admin.RoleViewer}
	var n int
	for b.Loop() {
		ds, err := svc.DestinationRates(ctx, viewer)
		if err != nil {
			b.Fatal(err)
		}
		n = len(ds)
	}
	b.ReportMetric(float64(n), "rows/op")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/op")
}
