package dedup

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// Each path that writes an outbox row with its effect names the destination on it (issue 31: a limited
// type's claim goes by destination): one request alone and requests batched by group commit; an effect
// created without one has none.
func TestCreateKeepsTheDestinationOnTheOutboxRow(t *testing.T) {
	t.Parallel()
	_, pool := newStore(t)
	ctx := context.Background()
	alone := NewStore(pool).WithGroupCommit(GroupCommit{MaxBatch: 1})
	if _, _, err := alone.Create(ctx, NewEffect{Tenant: "t", Key: "one", Type: "hook", Payload: json.RawMessage(`{}`),
		Destination: "a.example:443"}); err != nil {
		t.Fatal(err)
	}
	batched := NewStore(pool).WithGroupCommit(GroupCommit{MaxBatch: 16, Parallel: 1})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if _, _, err := batched.Create(ctx, NewEffect{Tenant: "t", Key: fmt.Sprintf("b%d", i), Type: "hook",
				Payload: json.RawMessage(`{}`), Destination: "b.example"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if _, _, err := alone.Create(ctx, NewEffect{Tenant: "t", Key: "none", Type: "hook", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for dest, want := range map[string]int{"a.example:443": 1, "b.example": 16} {
		if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_outbox WHERE destination = '`+dest+`'`); n != want {
			t.Errorf("%d outbox rows name %s, want %d", n, dest, want)
		}
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM oncegate_outbox WHERE destination IS NULL`); n != 1 {
		t.Errorf("%d outbox rows without a destination, want the one created without", n)
	}
}
