package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	if url != "" {
		// Named for the purpose, and still checked: a session lock and SET through a transaction pooler land
		// on a pooled server connection, where the lock outlives this gateway and the settings leak into
		// other clients' transactions.
		pooled, err := pooledURL(ctx, url, g.log)
		if err != nil {
			g.log.Error("partitions: the manager cannot reach ddl_url (or listen_url)", "err", err)
			return
		}
		if pooled {
			g.log.Error("partitions: ddl_url (or listen_url) goes through a connection pooler; the partition " +
				"manager needs a direct or session-mode connection and does not run here. Effects cannot be " +
				"created past the newest partition (docs/storage.md)")
			return
		}
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

// pooledURL reports whether url goes through a pooler (poolerProbe, once).
func pooledURL(ctx context.Context, url string, log *slog.Logger) (bool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return (&poolerProbe{cfg: pc.ConnConfig, log: log}).Pooled(ctx)
}
