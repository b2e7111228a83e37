package gateway

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/partitions"
)

// managePartitions runs the partition manager until ctx ends: in one gateway of the fleet at a time (its
// advisory lock), on a direct connection. Its session lock would land on a pooled server connection through
// PgBouncer in transaction mode, so without listen_url a gateway whose database_url goes through a pooler
// runs none, and says so.
func (g *Gateway) managePartitions(ctx context.Context) {
	p := g.cfg.Partitions
	if p.Disabled {
		return
	}
	url := g.cfg.ListenURL
	if url == "" {
		for {
			pooled, err := g.probe.Pooled(ctx)
			if err == nil && pooled {
				g.log.Warn("partitions: the attempt log's partitions are not managed by this gateway: database_url " +
					"goes through a connection pooler and listen_url is not set. Set listen_url to a direct or " +
					"session-mode connection, or partitions.disabled with partitions made otherwise")
				return
			}
			if err == nil {
				break
			}
			if sleep(ctx, time.Second); ctx.Err() != nil {
				return
			}
		}
		url = g.cfg.DatabaseURL
	}
	m, err := partitions.New(partitions.Config{ConnString: url, Interval: time.Duration(p.Interval), Ahead: p.Ahead,
		Retention: time.Duration(g.cfg.Retention.Keys), Logger: g.log})
	if err != nil {
		g.log.Error("partitions: the manager cannot run", "err", err)
		return
	}
	m.Run(ctx)
}
