package gateway

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
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
	for url != "" {
		// Named for the purpose, and still checked: a session lock and SET through a transaction pooler land
		// on a pooled server connection, where the lock outlives this gateway and the settings leak into
		// other clients' transactions. Asked again every second until it answers: a database unreachable
		// while this gateway starts (a failover, a rolling deploy) must not leave it without a manager.
		shared, err := sharesServerConnections(ctx, url)
		if err == nil && shared {
			g.log.Error("partitions: ddl_url (or listen_url) goes through a transaction-pooling connection pooler; " +
				"the partition manager needs a direct or session-mode connection and does not run here. Effects " +
				"cannot be created past the newest partition (docs/storage.md)")
			return
		}
		if err == nil {
			break
		}
		g.log.Warn("partitions: the manager cannot reach ddl_url (or listen_url); trying again", "err", err)
		if sleep(ctx, time.Second); ctx.Err() != nil {
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
	pc := g.cfg.partitionConfig()
	pc.ConnString, pc.Logger, pc.Fleet, pc.Owner = url, g.log, true, g.dispatcher.Owner()
	m, err := partitions.New(pc)
	if err != nil {
		g.log.Error("partitions: the manager cannot run", "err", err)
		return
	}
	g.managing.Store(true)
	defer g.managing.Store(false)
	m.Run(ctx)
}

// partitionConfig is the partition manager's configuration from the gateway's, without where it connects.
func (c *Config) partitionConfig() partitions.Config {
	return partitions.Config{Tables: partitions.Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys,
		time.Duration(c.Retention.Payloads)), Interval: time.Duration(c.Partitions.Interval), Ahead: c.Partitions.Ahead,
		Retention: time.Duration(c.Retention.Keys)}
}

// partitionSettings is what this gateway's heartbeat says it runs partitions with (partitions.Config.Settings),
// nil when it runs no partition manager: the fleet's settings change only once no gateway alive runs with
// them.
func (g *Gateway) partitionSettings() *string {
	if g.cfg.Partitions.Disabled || !g.managing.Load() {
		return nil
	}
	s := g.cfg.partitionConfig().Settings()
	return &s
}

// purgeInterval is the dispatcher's: the row-by-row purge runs (at its default pace) only where partitions
// are left to something else, which may keep them without dropping any.
func (c *Config) purgeInterval() time.Duration {
	if c.Partitions.Disabled {
		return 0
	}
	return -1
}

// sharesServerConnections reports whether url goes through a pooler that hands one server connection to
// several clients in turn (transaction or statement pooling), where a session's lock and settings are not its
// own. A session-mode pooler keeps a server connection for each client while it is connected, so a second
// client never gets the first one's while the first stays connected: the second is asked a few times, and a
// transaction pooler, which hands out the connection just released, gives it the first's. A direct connection
// or a session-mode pooler answers false.
func sharesServerConnections(ctx context.Context, url string) (bool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pid := func(c *pgx.Conn) (int64, error) {
		var p int64
		err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&p)
		return p, err
	}
	first, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err != nil {
		return false, err
	}
	defer func() { _ = first.Close(context.WithoutCancel(ctx)) }()
	held, err := pid(first)
	if err != nil {
		return false, err
	}
	for range 3 {
		second, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
		if err != nil {
			return false, err
		}
		p, err := pid(second)
		_ = second.Close(context.WithoutCancel(ctx))
		if err != nil {
			return false, err
		}
		if p == held {
			return true, nil
		}
	}
	return false, nil
}

// followFleet has this gateway's requests, and its proxy's, write by the fleet's retentions
// (partitions.Fleet): a key held for the fleet's retention.keys, a body kept apart when the fleet keeps bodies
// apart. A gateway whose own settings differ leaves partitions to the fleet's manager (ErrOtherSettings);
// before this, its requests still wrote by its own, keys of a minute among the fleet's of three, and bodies
// in rows the fleet's retention.payloads was meant to empty (an outside test). Read at the start and at every
// heartbeat, so that a change of the fleet's settings (a rolling change taken over) reaches every gateway
// within one. A read that fails keeps what was read before. With partitions.disabled the gateway keeps its
// own: it purges row by row, and bodies apart need a manager.
func (g *Gateway) followFleet(ctx context.Context) {
	if g.cfg.Partitions.Disabled {
		return
	}
	r, ok, err := partitions.Fleet(ctx, g.pool)
	if err != nil {
		if ctx.Err() == nil {
			g.log.Warn("partitions: reading the fleet's retentions failed; requests write by the ones read before",
				"err", err)
		}
		return
	}
	if !ok {
		return // no manager has run yet: this gateway's own are the first
	}
	g.follow.Set(r.Keys, r.Hold, r.Payloads > 0)
	if prev := g.followed.Swap(&r); prev != nil && *prev == r {
		return
	}
	own := partitions.Retentions{Keys: time.Duration(g.cfg.Retention.Keys), Payloads: time.Duration(g.cfg.Retention.Payloads),
		Hold: time.Duration(g.cfg.Retention.Keys)}
	if r != own {
		g.log.Warn("partitions: this gateway's requests write by the fleet's retentions, not by its own "+
			"configuration's (docs/storage.md)", "retention.keys", r.Keys.String(), "retention.payloads",
			r.Payloads.String(), "keys_held_after_finish", r.Hold.String(), "own_retention.keys", own.Keys.String(),
			"own_retention.payloads", own.Payloads.String())
	}
}
