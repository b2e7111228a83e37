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

// HeartbeatInterval is how often a gateway writes its row in oncegate_gateways. `oncegate gateway ls` counts
// a gateway not seen for three intervals as gone.
const HeartbeatInterval = 5 * time.Second

// heartbeat keeps this gateway's row (id, address, version, breakers, the types it delivers) current until ctx ends. A failed write
// is only logged: the row is for operators, and the next beat tries again.
func (g *Gateway) heartbeat(ctx context.Context, addr string) {
	started := time.Now()
	version := Version()
	types := slices.Sorted(maps.Keys(g.cfg.EffectTypes))
	beat := func() {
		b, _ := json.Marshal(g.dispatcher.Breakers())
		wctx, cancel := context.WithTimeout(ctx, HeartbeatInterval)
		defer cancel()
		if _, err := g.pool.Exec(wctx, heartbeatSQL, g.dispatcher.Owner(), addr, version, started, string(b), types); err != nil && ctx.Err() == nil {
			g.log.Warn("writing the gateway's heartbeat row failed", "err", err)
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
