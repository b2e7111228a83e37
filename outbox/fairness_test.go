package outbox

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/reliability"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
	"github.com/oncegate/oncegate/providers"
)

// hangsFor hangs every delivery of one tenant until its context ends (a destination that accepts and never
// answers) and delivers everyone else's at once.
type hangsFor struct {
	tenant  string
	hanging atomic.Int32
	most    atomic.Int32
	mu      sync.Mutex
}

func (h *hangsFor) Validate(json.RawMessage) error { return nil }

func (h *hangsFor) Deliver(ctx context.Context, d providers.Delivery) providers.Outcome {
	if d.Tenant != h.tenant {
		return providers.Delivered(nil)
	}
	n := h.hanging.Add(1)
	defer h.hanging.Add(-1)
	h.mu.Lock()
	h.most.Store(max(h.most.Load(), n))
	h.mu.Unlock()
	<-ctx.Done()
	return providers.Retry(ctx.Err())
}

// One tenant's destinations hanging take at most its share of a type's delivery slots: another tenant's
// effect of the same type is delivered at once, not after the hung calls time out. (The black-box run: 40
// hung ports of tenant beta held tenant alpha's webhook back 135 s.)
func TestOneTenantsHangingDestinationsLeaveSlotsForOthers(t *testing.T) {
	t.Parallel()
	result := reliability.Record(t, "Isolation",
		"Tenant beta's 40 effects to destinations that never answer, then one of tenant alpha's, same type",
		"alpha's is delivered at once; beta holds at most its share (tenant_concurrency) of the type's slots")
	f := newFixture(t)
	p := &hangsFor{tenant: "beta"}
	for i := range 40 {
		f.createFor("beta", "b"+strconv.Itoa(i), "hook", `{}`)
	}
	f.run(EffectType{Name: "hook", Provider: p, Concurrency: 4, Timeout: time.Hour})
	testenv.Eventually(t, 10*time.Second, "beta's deliveries to hang", func() bool { return p.hanging.Load() == 2 })
	f.createFor("alpha", "a", "hook", `{}`)
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, "alpha's effect delivered", func() bool {
		return f.getFor("alpha", "a").Status == effect.StatusDelivered
	})
	took := time.Since(start)
	if most := p.most.Load(); most > 2 {
		t.Fatalf("beta held %d of the type's 4 slots at once; its share is 2", most)
	}
	pending := 0
	for i := range 40 {
		e := f.getFor("beta", "b"+strconv.Itoa(i))
		if e.Attempts != 0 {
			t.Fatalf("beta's %s was charged %d attempts while it waited for a slot", e.Key, e.Attempts)
		}
		if e.Status == effect.StatusPending {
			pending++
		}
	}
	t.Logf("alpha delivered %v after it was requested; beta: 2 hanging, %d pending, uncharged", took, pending)
	result("alpha delivered in " + took.Round(10*time.Millisecond).String() + "; beta held 2 of 4 slots, 0 attempts charged")
}
