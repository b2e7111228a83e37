package gateway

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/dedup"
	"github.com/oncegate/oncegate/partitions"
)

// managePartitions runs the partition manager until ctx ends: in one gateway of the fleet at a time (its
// advisory lock), on a direct connection: ddl_url's, else listen_url's. Its session lock would land on a
// pooled server connection through PgBouncer in transaction mode, so without either a gateway whose
// database_url goes through a pooler runs none, and says so, loudly: effects cannot be created past the
// newest partition.
func (g *Gateway) managePartitions(ctx context.Context) {
	p := g.cfg.Partitions
	if p.Disabled {
		return
	}
	url := g.cfg.DDLURL
	if url == "" {
		url = g.cfg.ListenURL
	}
	if url == "" {
		for {
			pooled, err := g.probe.Pooled(ctx)
			if err == nil && pooled {
				g.log.Error("partitions: the effects' and attempt log's partitions are not managed by this " +
					"gateway: database_url goes through a connection pooler and neither ddl_url nor listen_url " +
					"is set. Without a manager no partition is made ahead, and effects past the newest cannot be " +
					"created. Set ddl_url (or listen_url) to a direct or session-mode connection, or " +
					"partitions.disabled with partitions made otherwise (docs/storage.md)")
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
	m, err := partitions.New(partitions.Config{ConnString: url, Tables: partitions.Tables(dedup.FreePartitionKeys),
		Interval: time.Duration(p.Interval), Ahead: p.Ahead,
		Retention: time.Duration(g.cfg.Retention.Keys), Logger: g.log})
	if err != nil {
		g.log.Error("partitions: the manager cannot run", "err", err)
		return
	}
	m.Run(ctx)
}

// purgeInterval is the dispatcher's: the row-by-row purge runs (at its default pace) only where partitions
// are left to something else, which may keep them without dropping any.
func (c *Config) purgeInterval() time.Duration {
	if c.Partitions.Disabled {
		return 0
	}
	return -1
}
