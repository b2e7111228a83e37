package gateway

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// An outcome connection is not checked when it is taken. pgxpool pings, by default, a connection idle more
// than a second before handing it out, and with target_session_attrs in database_url the gateway checks it
// against them again (readOnlyConns): each a round trip before the outcome's statement is written, inside the
// crash window. Outcome connections idle between bursts, and a gateway's first burst comes seconds after
// they opened: a chaos run with --gateway-log-level debug saw a restarted gateway's first outcome handed off
// 4.3 ms after the destination accepted it, seven more waiting, and all eight resent when it was killed
// meanwhile. Neither check is needed: a connection that died, or a server now read-only, fails the
// statement, which is then recorded again on another connection (and the read-only one dropped).
func TestAnIdleOutcomeConnectionIsNotCheckedWhenTaken(t *testing.T) {
	t.Parallel()
	var writes *pgtest.Writes
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := &Config{DatabaseURL: pgtest.Database(t) + "&target_session_attrs=read-write"}
	if !strings.Contains(cfg.DatabaseURL, "?") {
		cfg.DatabaseURL = strings.Replace(cfg.DatabaseURL, "&", "?", 1)
	}
	main, _, err := newPool(context.Background(), cfg, log, func(pcfg *pgxpool.Config) {
		writes = pgtest.CountWrites(&pcfg.ConnConfig.Config)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(main.Close)
	outcomes, err := newOutcomePool(main, 1, 1, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(outcomes.Close)
	if n := outcomes.Stat().IdleConns(); n != 1 {
		t.Fatalf("%d outcome connections open, want 1", n)
	}
	time.Sleep(1200 * time.Millisecond) // idle longer than pgxpool's ping threshold and recheckEvery
	writes.Arm()
	c, err := outcomes.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
	if n := writes.Count(); n != 0 {
		t.Errorf("taking an outcome connection idle 1.2 s wrote %d times to Postgres, want 0", n)
	}
}
