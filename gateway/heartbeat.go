package gateway

import (
	"context"
	_ "embed"
	"encoding/json"
	"maps"
	"runtime/debug"
	"slices"
	"time"
)

//go:embed heartbeat.sql
var heartbeatSQL string

//go:embed stopped.sql
var stoppedSQL string

// HeartbeatInterval is how often a gateway writes its row in oncegate_gateways. `oncegate gateway ls` counts
// a gateway not seen for three intervals as gone.
const HeartbeatInterval = 5 * time.Second

// fencesForgottenABeat bounds the old job fences one heartbeat deletes: 2,000 a second for each gateway,
// more than a fleet at 100 million effects a day makes, in statements short enough to hold up nothing.
const fencesForgottenABeat = 10_000

// heartbeat keeps this gateway's row (id, address, version, breakers, the types it delivers, the requests
// each tenant holds open in it) current until ctx ends. A failed write is only logged: the row is for
// operators, and the next beat tries again.
func (g *Gateway) heartbeat(ctx context.Context, addr string) {
	started := time.Now()
	beat := func() {
		wctx, cancel := context.WithTimeout(ctx, HeartbeatInterval)
		defer cancel()
		if err := g.writeHeartbeat(wctx, addr, started); err != nil && ctx.Err() == nil {
			g.log.Warn("writing the gateway's heartbeat row failed", "err", err)
		}
		g.checkConnections(wctx)
		g.followFleet(wctx)
		if n, err := g.store.ForgetFences(wctx, fencesForgottenABeat); err != nil && ctx.Err() == nil {
			g.log.Warn("forgetting old job fences failed; the next heartbeat tries again", "err", err)
		} else if n > 0 {
			g.log.Debug("forgot the fences of jobs that asked for no effect for retention.keys", "fences", n)
		}
	}
	beat()
	t := time.NewTicker(HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			beat()
		}
	}
}

// markStopped says in this gateway's heartbeat row that it is stopping, and reports whether the write went
// through: the fleet counts it gone at once (the connection budget, the partition manager's settings,
// `gateway ls`), where its last heartbeat alone read as alive for three more intervals. A write that fails
// is tried again once the stop is done, and failing then too leaves it to the clock.
func (g *Gateway) markStopped() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := g.pool.Exec(ctx, stoppedSQL, g.dispatcher.Owner()); err != nil {
		g.log.Warn("marking the gateway's heartbeat row stopped failed; the fleet counts it gone in three heartbeats",
			"err", err)
		return false
	}
	return true
}

// Version is the gateway binary's version: its module version, else its VCS revision, else "devel".
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return s.Value[:12]
		}
	}
	return "devel"
}

// writeHeartbeat writes this gateway's row once.
func (g *Gateway) writeHeartbeat(ctx context.Context, addr string, started time.Time) error {
	breakers, _ := json.Marshal(g.dispatcher.Breakers())
	held, _ := json.Marshal(g.held.snapshot())
	_, err := g.pool.Exec(ctx, heartbeatSQL, g.dispatcher.Owner(), addr, Version(), started, string(breakers),
		slices.Sorted(maps.Keys(g.cfg.EffectTypes)), string(held), g.partitionSettings())
	return err
}
