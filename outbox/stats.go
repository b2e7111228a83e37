package outbox

import (
	"context"
	_ "embed"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed sql/stale_stats.sql
var staleStatsSQL string

// statsEvery is how often at most a dispatcher whose claims come back full asks whether Postgres's statistics
// of the outbox still say it is empty.
const statsEvery = 5 * time.Second

// statsLoop keeps the planner's view of the outbox honest while this dispatcher drains a backlog. A queue's table goes empty and is vacuumed; VACUUM then notes its pages and no row in them, and
// until autovacuum's next ANALYZE (a minute or more away) the planner believes the table empty and may join
// to it by reading it whole: a burst into a drained outbox was recorded at 1.85 s a batch of outcomes, its
// deliveries fell from 1,800 a second to 100, and every outcome waited that long to be recorded. The
// statements are written to probe by primary key (dedup's plan tests), but the planner may pick any index of
// a table it believes empty; an ANALYZE of such a table, cheap while it is small, ends that. It is not done
// more than that asks: each ANALYZE makes every connection plan again each statement that reads the outbox
// (stale_stats.sql). It needs the tables' owner (the user that ran the migrations); for another, Postgres skips it with a warning in its log.
func (d *Dispatcher) statsLoop(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.backlogSeen:
		}
		if time.Since(last) < statsEvery {
			continue
		}
		last = time.Now()
		if err := d.analyzeStale(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("checking the outbox's statistics failed", "err", err)
		}
	}
}

func (d *Dispatcher) analyzeStale(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rows, err := d.pool.Query(cctx, staleStatsSQL)
	if err != nil {
		return err
	}
	stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, table := range stale {
		start := time.Now()
		// ANALYZE waits for no writer (SHARE UPDATE EXCLUSIVE), but would wait for a VACUUM of the table: that
		// one's ANALYZE is as good.
		err := pgx.BeginFunc(cctx, d.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(cctx, "SET LOCAL lock_timeout = '1s'"); err != nil {
				return err
			}
			_, err := tx.Exec(cctx, "ANALYZE "+pgx.Identifier{table}.Sanitize())
			return err
		})
		if err != nil {
			return err
		}
		d.log.Info("analyzed a table whose statistics said it was empty while a backlog was claimed from it",
			"table", table, "took", time.Since(start).String())
	}
	return nil
}
