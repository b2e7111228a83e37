package gateway

import (
	"context"
	_ "embed"
)

//go:embed connbudget.sql
var connBudgetSQL string

// connBudget is what the fleet's pools can ask of Postgres, as a gateway last judged it.
type connBudget struct {
	gateways, want, room int
}

// checkConnections warns when the gateways alive on this database, each at this gateway's pool_max_conns plus
// its LISTEN connection, can ask Postgres for more connections than its max_connections less the superuser
// reserve. Postgres refuses a connection past that; the gateway refused waits for a pooled one while the
// others hold theirs, and a fleet bench of three gateways at the default 40 on a Postgres of 100 ran minutes
// behind. Other gateways' pool sizes are not known here: each is counted at this one's. Behind a pooler the
// pooler bounds the server connections, and nothing is checked. It warns again only when the figures change.
func (g *Gateway) checkConnections(ctx context.Context) {
	if pooled, err := g.probe.Pooled(ctx); err != nil || pooled {
		return
	}
	var gateways, maxConns, reserved int
	if err := g.pool.QueryRow(ctx, connBudgetSQL, 3*HeartbeatInterval.Seconds()).Scan(&gateways, &maxConns, &reserved); err != nil {
		if ctx.Err() == nil {
			g.log.Debug("reading the connection budget failed", "err", err)
		}
		return
	}
	gateways = max(gateways, 1)
	pc, err := g.cfg.poolConfig() // pool_max_conns as set, which the gateway's pools share out
	if err != nil {
		return
	}
	poolMax := int(pc.MaxConns)
	b := connBudget{gateways: gateways, want: gateways * (poolMax + 1), room: maxConns - reserved}
	g.budgetMu.Lock()
	last := g.budget
	g.budget = b
	g.budgetMu.Unlock()
	if b.want <= b.room || b == last {
		return
	}
	g.log.Warn("the gateways' pools together can ask Postgres for more connections than it allows",
		"gateways", b.gateways, "pool_max_conns", poolMax, "up_to", b.want,
		"max_connections", maxConns, "superuser_reserved_connections", reserved,
		"fix", "set pool_max_conns in database_url so that gateways × (pool_max_conns + 1) plus Postgres's other "+
			"clients fit max_connections less the reserve, raise max_connections, or put PgBouncer in front")
}
