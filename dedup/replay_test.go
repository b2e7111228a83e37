package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// statementCounter counts the statements a pool sends.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Issue 14: a replay cost two statements, the insert that found the key taken and a read of the stored
// effect. The insert now returns the stored effect itself, so a replay, fenced or not, is one statement (two
// with the fence's) and writes nothing, and a reuse of the key is found as cheaply.
func TestReplayIsOneStatement(t *testing.T) {
	t.Parallel()
	var counter statementCounter
	pool := pgtest.TracedPool(t, pgtest.Database(t), &counter)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		store *Store
		job   string
	}{
		{"alone", NewStore(pool), ""},
		{"group-commit", NewStore(pool).WithGroupCommit(DefaultGroupCommit), ""},
		{"fenced", NewStore(pool), "job-1"},
	} {
		ne := NewEffect{Tenant: tc.name, Key: "k", Type: "t", Payload: json.RawMessage(`{"a":1}`), JobID: tc.job, JobEpoch: 1}
		first, replayed, err := tc.store.Create(ctx, ne)
		if err != nil || replayed {
			t.Fatalf("%s: create: %v %v", tc.name, replayed, err)
		}
		want := int64(1)
		if tc.job != "" {
			want = 4 // begin, fence, insert, commit
		}
		before := counter.n.Load()
		again, replayed, err := tc.store.Create(ctx, ne)
		if err != nil || !replayed || again.ID != first.ID || again.StableID != first.StableID {
			t.Fatalf("%s: replay: %+v %v %v", tc.name, again, replayed, err)
		}
		if n := counter.n.Load() - before; n != want {
			t.Errorf("%s: a replay took %d statements, want %d", tc.name, n, want)
		}
		before = counter.n.Load()
		ne.Payload = json.RawMessage(`{"a":2}`)
		var reused *KeyReusedError
		if _, _, err := tc.store.Create(ctx, ne); !errors.As(err, &reused) {
			t.Fatalf("%s: another payload under the key: %v", tc.name, err)
		}
		if n := counter.n.Load() - before; n != want {
			t.Errorf("%s: a reused key took %d statements, want %d", tc.name, n, want)
		}
	}
	// The dedup proxy's create, which leases the new row to the request, replays in one statement too.
	s := NewStore(pool)
	ne := NewEffect{Tenant: "proxy", Key: "k", Type: "t", Payload: json.RawMessage(`{"a":1}`)}
	h := Holder{Owner: "me", Lease: time.Minute}
	first, c, _, err := s.CreateLeased(ctx, ne, nil, h)
	if err != nil || c == nil {
		t.Fatalf("create leased: %v %v", c, err)
	}
	before := counter.n.Load()
	again, c, replayed, err := s.CreateLeased(ctx, ne, nil, h)
	if err != nil || !replayed || c != nil || again.ID != first.ID || again.StableID != first.StableID {
		t.Fatalf("leased replay: %+v %v %v %v", again, c, replayed, err)
	}
	if n := counter.n.Load() - before; n != 1 {
		t.Errorf("a leased replay took %d statements, want 1", n)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_outbox`); n != 4 {
		t.Fatalf("%d outbox rows for 4 effects", n)
	}
}
