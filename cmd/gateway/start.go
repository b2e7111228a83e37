package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncegate/oncegate/gateway"
)

// startWait bounds how long a starting gateway waits for its database to take connections: Postgres still
// starting beside it (a compose file, a machine's boot), a failover, or a server too loaded to answer within
// connect_timeout. A gateway that exited at once left that wait to its supervisor's restarts, and a CI run
// saw one restarted under load exit on a single connection that timed out.
const startWait = 30 * time.Second

// migrateOnStart applies pending migrations, trying again, with backoff and a warning each time, while the
// database cannot be connected to, for up to startWait. Any other error (a database that does not exist, a
// role refused, a migration that fails, a lock that is not released) ends the start at once.
func migrateOnStart(ctx context.Context, g *gateway.Gateway, log *slog.Logger) error {
	deadline := time.Now().Add(startWait)
	wait := 250 * time.Millisecond
	for {
		err := g.Migrate(ctx)
		// A server that answered (a database that does not exist, a password refused) is no wait's to mend.
		var connect *pgconn.ConnectError
		var answered *pgconn.PgError
		if err == nil || !errors.As(err, &connect) || errors.As(err, &answered) || time.Now().Add(wait).After(deadline) {
			return err
		}
		log.Warn("the database cannot be reached yet; trying again", "in", wait.String(),
			"gives_up_at", deadline.Format(time.RFC3339), "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 4*time.Second)
	}
}
