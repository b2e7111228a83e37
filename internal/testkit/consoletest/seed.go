// Package consoletest seeds a gateway database and a queue's Redis with what an operator sees in the web
// console, through the same tables and the same queue calls the gateway and the workers use: for the
// console's tests, its browser tests and its benchmark. It keeps nothing but that a seeded store looks like
// one in production.
package consoletest

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/queue"
)

//go:embed seed_effects.sql
var seedEffectsSQL string

// Effects inserts n effects keyed prefix+b+"-"+i, created evenly over the last span (see seed_effects.sql
// for the mix of statuses), in batches of 100,000 (b numbers the batch) so that a million fits in memory.
// Ids grow with created_at, as the gateway's do.
func Effects(ctx context.Context, db *pgxpool.Pool, n int, span time.Duration, prefix string) error {
	const batch = 100_000
	for from := 0; from < n; from += batch {
		k := min(batch, n-from)
		// In float seconds: a Duration times a count overflows int64 for a month of a million effects.
		slice := span.Seconds() * float64(k) / float64(n)
		end := span.Seconds() * float64(n-from-k) / float64(n)
		if _, err := db.Exec(ctx, seedEffectsSQL, k, slice, fmt.Sprintf("%s%d-", prefix, from/batch), end); err != nil {
			return fmt.Errorf("consoletest: seed effects: %w", err)
		}
	}
	// The destinations' per-minute rollup, as gateways write it beside their attempt logs: every call in the
	// 100 ms bucket.
	if _, err := db.Exec(ctx, `
		INSERT INTO oncegate_destination_minutes AS d (minute, type, destination, attempts, delivered, failed, retried,
			in_doubt, latency_buckets)
		SELECT date_trunc('minute', started_at), type, destination, count(*),
		       count(*) FILTER (WHERE outcome = 'delivered'), count(*) FILTER (WHERE outcome = 'failed'),
		       count(*) FILTER (WHERE outcome = 'retry'), count(*) FILTER (WHERE outcome IN ('in_doubt', 'interrupted')),
		       array_fill(0::bigint, ARRAY[6]) || ARRAY[count(*)] || array_fill(0::bigint, ARRAY[9])
		FROM oncegate_effect_attempts WHERE type IS NOT NULL AND destination IS NOT NULL
		GROUP BY 1, 2, 3
		ON CONFLICT (minute, type, destination) DO NOTHING`); err != nil {
		return fmt.Errorf("consoletest: seed the destinations' rollup: %w", err)
	}
	return nil
}

// Gateways records three gateway heartbeats, one live, one gone half an hour ago and one gone three hours
// ago (folded away by default), with breakers in each state.
func Gateways(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `INSERT INTO oncegate_gateways (id, address, version, started_at, last_seen, breakers, types, held) VALUES
	  ('gw-1', '10.0.0.11:8080', 'v0.9.0', now() - interval '3 hours', now(),
	   '[{"type":"email","tenant":"acme","destination":"smtp.example.com:587","state":"closed"},
	     {"type":"webhook","tenant":"globex","destination":"hooks.globex.example","state":"open","open_until":"2030-01-01T00:00:00Z"}]',
	   '{email,webhook}', '{"acme":12,"globex":3}'),
	  ('gw-2', '10.0.0.12:8080', 'v0.9.0', now() - interval '2 days', now() - interval '30 minutes',
	   '[{"type":"webhook","tenant":"acme","destination":"api.acme.example","state":"half-open"}]', '{webhook}', '{}'),
	  ('gw-0', '10.0.0.10:8080', 'v0.8.9', now() - interval '20 hours', now() - interval '3 hours',
	   '[{"type":"webhook","tenant":"globex","destination":"hooks.globex.example","state":"open","open_until":"2030-01-01T00:00:00Z"}]',
	   '{webhook}', '{}')`)
	return err
}

// DeadJobs enqueues n jobs on q and runs a worker whose handler refuses each for good, until all n are dead:
// dead letters made the way a real worker makes them. IDs are prefix+i.
func DeadJobs(ctx context.Context, q *queue.Queue, n int, prefix string) ([]string, error) {
	jobs := make([]queue.NewJob, n)
	ids := make([]string, n)
	for i := range jobs {
		ids[i] = fmt.Sprintf("%s%d", prefix, i+1)
		jobs[i] = queue.NewJob{ID: ids[i], Kind: "send-receipt", Payload: []byte(fmt.Sprintf(`{"order":%d}`, i+1)),
			MaxAttempts: 1}
	}
	if _, err := q.EnqueueMany(ctx, jobs); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := queue.NewWorker(q, queue.HandlerFunc(func(context.Context, *queue.Job) error {
		return queue.Permanent(errors.New("receipt template missing: order has no currency"))
	}), &queue.WorkerConfig{Concurrency: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := q.Stats(ctx)
		if err != nil {
			return nil, err
		}
		if st.Counts[queue.StateDead] >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			return nil, fmt.Errorf("consoletest: %d of %d jobs dead after 30s", st.Counts[queue.StateDead], n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	return ids, nil
}

// ReadyJobs enqueues n ready jobs on q in batches of 10,000, IDs prefix+i.
func ReadyJobs(ctx context.Context, q *queue.Queue, n int, prefix string) error {
	const batch = 10_000
	for from := 0; from < n; from += batch {
		jobs := make([]queue.NewJob, 0, batch)
		for i := from; i < min(from+batch, n); i++ {
			jobs = append(jobs, queue.NewJob{ID: fmt.Sprintf("%s%d", prefix, i+1), Kind: "send-receipt",
				Payload: []byte(fmt.Sprintf(`{"order":%d}`, i+1))})
		}
		if _, err := q.EnqueueMany(ctx, jobs); err != nil {
			return err
		}
	}
	return nil
}
