package gateway

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/dedup"
)

// A commit that waits for a synchronous standby and is cut short (the request's timeouts.database ran out, or
// its connection closed) is not rolled back: Postgres keeps it on the primary, unreplicated, and the request
// is answered 503. The client retries with the same key, as it should, and finds the effect: a replay. Were
// the replay acknowledged at once, a failover to the standby right after would lose an effect the gateway
// acknowledged (an outside tester: 15 of 629). So while the database replicates synchronously, a replay, and a
// read of a recent effect, first runs a durability barrier (dedup.Store.Barrier): a write of its own, whose
// commit returns only once the standby has everything committed before it. With the standby away the barrier
// waits as every commit does, and the request is a 503 again, which is the truth.

// readBarrierWindow bounds the reads that run a barrier: an effect older than this was read (or replayed)
// long after its create, and polling GETs of old effects would otherwise each cost a write.
const readBarrierWindow = 10 * time.Minute

// durable returns once effects committed before now are on a synchronous standby, when the database makes
// commits wait for one; at once otherwise.
func (g *Gateway) durable(ctx context.Context) error {
	if !g.syncReplication.Load() {
		return nil
	}
	slot := int(g.barrierSlot.Add(1)) % dedup.BarrierSlots
	return g.store.Barrier(ctx, g.dispatcher.Owner(), slot)
}

// durableRead is durable for a read of e: only when e is recent.
func (g *Gateway) durableRead(ctx context.Context, e *dedup.Effect) error {
	if e == nil || time.Since(e.CreatedAt) > readBarrierWindow {
		return nil
	}
	return g.durable(ctx)
}
