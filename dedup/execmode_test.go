package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// Behind PgBouncer in transaction pooling mode (1.18, without max_prepared_statements) a connection cannot
// keep prepared statements: the gateway then runs pgx's exec mode, or an operator chooses simple_protocol,
// and in both pgx encodes each argument from its Go type alone. Every statement of the store runs here in
// every mode pgx has, so that a type pgx cannot encode without the server's description fails here.
func TestEveryStatementRunsInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	base := pgtest.Database(t)
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			u, err := url.Parse(base)
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("default_query_exec_mode", mode)
			u.RawQuery = q.Encode()
			pool := pgtest.Pool(t, u.String())
			exerciseStore(t, NewStore(pool), pool, mode)
			// And the group commit's statements (insert_batch, get_batch, finish_batch).
			exerciseStore(t, NewStore(pool).WithGroupCommit(DefaultGroupCommit), pool, mode+"-batched")
		})
	}
}

// exerciseStore runs each of the store's statements once, under tenant, and checks what each returned.
func exerciseStore(t *testing.T, s *Store, pool *pgxpool.Pool, tenant string) {
	t.Helper()
	// Inside a trace, so that the outbox row's trace context goes in too.
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2},
		TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	payload := json.RawMessage(`{ "to": ["a@example.com"], "n": 1.50, "s": "caf\u00e9" }`)
	e, replayed, err := s.Create(ctx, NewEffect{Tenant: tenant, Key: "k1", Type: tenant, Payload: payload})
	must("create", err)
	if replayed {
		t.Fatal("a first create was a replay")
	}
	// The attempt log's statement, with its per-minute rollup of the destination (a bigint[] sliced per index).
	alog := NewAttemptLog(pool, time.Hour, nil)
	for _, outcome := range []string{"delivered", "retry"} {
		alog.Record(Attempt{EffectID: e.ID, Attempt: 1, Start: time.Now(), Gateway: "gw", Outcome: outcome,
			Latency: 3 * time.Millisecond, Called: true, Type: tenant, Destination: "dest"})
	}
	must("flush attempts", alog.Flush(ctx))
	var attempts, delivered int64
	var buckets []int64
	must("read the rollup", pool.QueryRow(ctx, `SELECT attempts, delivered, latency_buckets
		FROM oncegate_destination_minutes WHERE type = $1`, tenant).Scan(&attempts, &delivered, &buckets))
	if attempts != 2 || delivered != 1 || len(buckets) != len(LatencyBuckets)+1 || buckets[2] != 2 {
		t.Fatalf("the rollup holds %d attempts, %d delivered, buckets %v", attempts, delivered, buckets)
	}
	again, replayed, err := s.Create(ctx, NewEffect{Tenant: tenant, Key: "k1", Type: tenant, Payload: payload})
	must("replay", err)
	if !replayed || again.ID != e.ID {
		t.Fatalf("replay: %+v, replayed %v", again, replayed)
	}
	_, _, err = s.Create(ctx, NewEffect{Tenant: tenant, Key: "k2", Type: tenant, Payload: json.RawMessage(`{}`),
		JobID: "job", JobEpoch: 2})
	must("fenced create", err)
	_, _, err = s.Create(ctx, NewEffect{Tenant: tenant, Key: "k3", Type: tenant, Payload: json.RawMessage(`{}`),
		JobID: "job", JobEpoch: 1})
	var fenced *FencedError
	if !errors.As(err, &fenced) {
		t.Fatalf("create under a lower epoch: %v", err)
	}
	page, err := s.List(ctx, tenant, Filter{Status: effect.StatusPending, Type: tenant, Limit: 1})
	must("list", err)
	if len(page.Effects) != 1 || page.Next == "" {
		t.Fatalf("first page: %+v", page)
	}
	page, err = s.List(ctx, tenant, Filter{Limit: 10, Cursor: page.Next})
	must("list after a cursor", err)
	if len(page.Effects) != 1 {
		t.Fatalf("second page: %+v", page)
	}

	rows, err := s.Claim(ctx, ClaimParams{Type: tenant, Limit: 10, Owner: "me", Lease: time.Minute,
		SkipTenants: []string{"someone-else"}})
	must("claim", err)
	if len(rows) != 2 || rows[0].Payload == nil || rows[0].Trace["traceparent"] == "" {
		t.Fatalf("claimed %+v", rows)
	}
	byKey := map[string]Claimed{}
	for _, r := range rows {
		byKey[r.Key] = r
	}
	p, err := s.Payload(ctx, byKey["k1"].Lease)
	must("payload", err)
	if string(p) != string(payload) {
		t.Fatalf("payload read back as %s", p)
	}
	must("release", s.release(ctx, []Claimed{byKey["k2"]}))
	must("reschedule", s.Reschedule(ctx, byKey["k1"].Lease, Reschedule{LastError: "503", Attempted: true}))
	if err := s.Finish(ctx, byKey["k1"].Lease, Finish{Status: effect.StatusDelivered}); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("finish under a lost lease: %v", err)
	}
	rows, err = s.Claim(ctx, ClaimParams{Type: tenant, Limit: 10, Owner: "me", Lease: time.Minute})
	must("claim again", err)
	if len(rows) != 2 {
		t.Fatalf("claimed again %+v", rows)
	}
	if s.batcher != nil {
		// Lone requests go inline (insert.sql); the batch statements run when requests meet.
		fp, err := Fingerprint(tenant, json.RawMessage(`{}`))
		must("fingerprint", err)
		batch := []*insertion{
			{ne: NewEffect{Tenant: tenant, Key: "b1", Type: tenant, Payload: json.RawMessage(`{}`),
				Tags: []string{"Customer 42"}, Terms: []string{"customer 42", "carol@example.test"}}, fp: fp,
				trace:    json.RawMessage(`{"traceparent":"00-01000000000000000000000000000000-0200000000000000-01"}`),
				stableID: effect.NewStableID(tenant, "b1")},
			{ne: NewEffect{Tenant: tenant, Key: "k1", Type: tenant, Payload: payload}, fp: fp,
				stableID: effect.NewStableID(tenant, "k1")},
		}
		created, stored, err := s.batcher.insertMany(ctx, batch)
		must("insert a batch", err)
		if len(created) != 1 || created[batch[0].stableID] == nil {
			t.Fatalf("batch created %v", created)
		}
		if len(stored) != 1 || stored[[2]string{tenant, "k1"}] == nil {
			t.Fatalf("batch read back %v", stored)
		}
		var tags, terms []string
		must("read the tags", pool.QueryRow(ctx, "SELECT tags, search_terms FROM oncegate_effects WHERE key = 'b1'").
			Scan(&tags, &terms))
		if fmt.Sprint(tags, terms) != "[Customer 42] [customer 42 carol@example.test]" {
			t.Fatalf("the batch stored tags %q and terms %q", tags, terms)
		}
		existing, err := s.batcher.getMany(ctx, batch[1:])
		must("read a batch", err)
		if existing[[2]string{tenant, "k1"}] == nil {
			t.Fatalf("batch read %v", existing)
		}
		if _, err := pool.Exec(ctx, `WITH e AS (DELETE FROM oncegate_effects WHERE key = 'b1' RETURNING tenant, key)
			DELETE FROM oncegate_keys k USING e WHERE k.tenant = e.tenant AND k.key = e.key`); err != nil {
			t.Fatal(err)
		}
	}
	finish := Finish{Status: effect.StatusDead, Result: json.RawMessage(`{"id":1}`), LastError: "gone", Attempted: true}
	if s.batcher != nil {
		// As a batch of TxProvider deliveries records them: leases locked, then finished, in one transaction.
		tx, err := pool.Begin(ctx)
		must("begin", err)
		defer func() { _ = tx.Rollback(ctx) }()
		leases := []Lease{rows[0].Lease, rows[1].Lease}
		held, err := s.WithTx(tx).LockLeases(ctx, leases)
		must("lock leases", err)
		recorded, err := s.WithTx(tx).FinishAll(ctx, leases, []Finish{finish, finish})
		must("finish a batch", err)
		if len(held) != 2 || len(recorded) != 2 {
			t.Fatalf("locked %v, recorded %v", held, recorded)
		}
		must("commit", tx.Commit(ctx))
	} else {
		for _, r := range rows {
			must("finish", s.Finish(ctx, r.Lease, finish))
		}
	}
	done, err := s.Terminal(ctx, []int64{e.ID, e.ID + 1000})
	must("terminal", err)
	if len(done) != 1 || done[0] != e.ID {
		t.Fatalf("terminal of %d: %v", e.ID, done)
	}
	retried, err := s.Retry(ctx, tenant, "k1")
	must("retry", err)
	if retried.Status != effect.StatusPending || retried.Attempts != 0 {
		t.Fatalf("retried: %+v", retried)
	}
	_, err = s.Backlogs(ctx)
	must("backlogs", err)
	if _, err := pool.Exec(ctx, "UPDATE oncegate_effects SET finished_at = now() - interval '1 hour' WHERE key = 'k2'"); err != nil {
		t.Fatal(err)
	}
	n, err := s.Purge(ctx, time.Minute, 10)
	must("purge", err)
	if n != 1 {
		t.Fatalf("purged %d", n)
	}
}
