package dedup

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/effect"
	"github.com/oncegate/oncegate/internal/testkit/pgtest"
	"github.com/oncegate/oncegate/internal/testkit/proctest"
	"github.com/oncegate/oncegate/internal/testkit/testenv"
)

// Where the crash window of an outcome ends. A gateway killed after a destination accepted an effect resends
// it, unless the outcome was recorded; and it was, once the statement recording it was written to Postgres:
// Postgres runs and commits a statement it has read whole though its client is gone. So the window ends at
// the handoff (Finish.OnHandoff), not at the commit's answer, which is what oncegate_outcome_handoff_seconds
// measures. A real process is SIGKILLed right after the write, and right before it.
func TestAnOutcomeHandedOffOutlivesItsGateway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		when     string
		recorded bool
	}{{"after-write", true}, {"before-write", false}} {
		t.Run(tc.when, func(t *testing.T) {
			t.Parallel()
			s, pool := newStore(t)
			create(t, s, "k")
			r := claimOne(t, s)
			child := proctest.ReExec(t, "handoff", "HANDOFF_DB="+pool.Config().ConnConfig.ConnString(),
				"HANDOFF_EFFECT="+strconv.FormatInt(r.EffectID, 10), "HANDOFF_TOKEN="+uuidText(r.Token),
				"HANDOFF_KILL="+tc.when)
			child.WaitLine("ready", 30*time.Second)
			if err := child.Wait(30 * time.Second); err == nil {
				t.Fatalf("the process was not killed: %s", child.Log())
			}
			// The statement may not even have been read when the kill is seen: wait for the killed process's
			// connections to end, which Postgres sees only once it has run all it read.
			testenv.Eventually(t, 10*time.Second, "the killed process's connections end", func() bool {
				return pgtest.Count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND application_name = 'handoff'`) == 0
			})
			var status string
			var leased bool
			if err := pool.QueryRow(context.Background(), `SELECT status, EXISTS (SELECT FROM oncegate_outbox
				WHERE effect_id = $1 AND lease_token = $2) FROM oncegate_effects WHERE id = $1`,
				r.EffectID, uuidText(r.Token)).Scan(&status, &leased); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.recorded && (status != string(effect.StatusDelivered) || leased):
				t.Fatalf("killed after handing the outcome off: status %s, still leased %v; want delivered, out of "+
					"the outbox", status, leased)
			case !tc.recorded && (status == string(effect.StatusDelivered) || !leased):
				t.Fatalf("killed before handing the outcome off: status %s, still leased %v; want it leased, to be "+
					"rescued and resent (else the test does not reach the window)", status, leased)
			}
		})
	}
}

// handoffProcess is a gateway's outcome write in a process of its own: it records one delivered outcome
// through a batching store's outcome connections, and SIGKILLs itself at HANDOFF_KILL: right after the
// statement is written to the socket, or right before.
func handoffProcess() int {
	ctx := context.Background()
	id, _ := strconv.ParseInt(os.Getenv("HANDOFF_EFFECT"), 10, 64)
	var token [16]byte
	if b, err := hex.DecodeString(strings.ReplaceAll(os.Getenv("HANDOFF_TOKEN"), "-", "")); err != nil || len(b) != 16 {
		fmt.Fprintln(os.Stderr, "token:", err)
		return 2
	} else {
		copy(token[:], b)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("HANDOFF_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "handoff"
	var armed atomic.Bool
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return killingConn{Conn: c, armed: &armed}, nil
	}
	cfg.MinConns, cfg.MaxConns = 1, 1
	outcomes, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	main, err := pgxpool.New(ctx, os.Getenv("HANDOFF_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s := NewStore(main).WithGroupCommit(GroupCommit{MaxBatch: 8, Parallel: 1, Outcomes: outcomes})
	// The outcome connection is opened, and has prepared the statement (whose first use is a round trip of
	// its own, before the one that runs it), by a Finish under a lease that is no one's.
	warm := Finish{Status: effect.StatusDelivered, Attempted: true, External: true}
	if err := s.Finish(ctx, Lease{EffectID: id, Token: [16]byte{1}}, warm); !errors.Is(err, ErrLeaseLost) {
		fmt.Fprintln(os.Stderr, "warm-up finish:", err)
		return 2
	}
	f := Finish{Status: effect.StatusDelivered, Attempted: true, External: true}
	if os.Getenv("HANDOFF_KILL") == "before-write" {
		f.OnHandoff = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	} else {
		f.OnHandoff = func() { armed.Store(true) }
	}
	fmt.Println("ready")
	err = s.Finish(ctx, Lease{EffectID: id, Token: token}, f)
	fmt.Fprintln(os.Stderr, "not killed; finish:", err)
	return 0
}

// killingConn SIGKILLs its process as soon as a write is done, once armed.
type killingConn struct {
	net.Conn
	armed *atomic.Bool
}

func (c killingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.armed.Load() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	return n, err
}

// An outcome goes out in one write from its handoff, on a connection just opened: PrepareOutcomes, run as
// the connection opens, has prepared its statement, whose first use would otherwise be a round trip of its
// own inside the crash window. Both the one-row statement and the batch's are checked, in pgx's default mode
// (which caches prepared statements) and in exec mode (a transaction-pooling PgBouncer's), which prepares
// nothing and needs nothing.
func TestAnOutcomeGoesOutInOneWrite(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s, pool := newStore(t)
			create(t, s, "one")
			create(t, s, "two")
			create(t, s, "three")
			rows, err := s.Claim(context.Background(), ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute})
			if err != nil || len(rows) != 3 {
				t.Fatalf("claim: %d rows, err %v", len(rows), err)
			}
			cfg := pool.Config()
			cfg.ConnConfig.DefaultQueryExecMode = map[string]pgx.QueryExecMode{"cache_statement": pgx.QueryExecModeCacheStatement,
				"exec": pgx.QueryExecModeExec}[mode]
			writes := pgtest.CountWrites(&cfg.ConnConfig.Config)
			outcomes := outcomePool(t, cfg, PrepareOutcomes, 1, 1)
			// One Finish alone is recorded in a statement of its own (finish.sql).
			f := Finish{Status: effect.StatusDelivered, Attempted: true, External: true, OnHandoff: writes.Arm}
			if err := finishOne(context.Background(), outcomes, rows[0].Lease, f); err != nil {
				t.Fatal(err)
			}
			if n := writes.Count(); n != 1 {
				t.Errorf("finish.sql went out in %d writes from its handoff, want 1", n)
			}
			// Several are recorded in one statement behind pin.sql (finish_batch.sql).
			writes.Disarm()
			recorded, err := finishAll(context.Background(), outcomes, []Lease{rows[1].Lease, rows[2].Lease}, []Finish{f, f})
			if err != nil || len(recorded) != 2 {
				t.Fatalf("finishAll: %v recorded, err %v", recorded, err)
			}
			if n := writes.Count(); n != 1 {
				t.Errorf("finish_batch.sql went out in %d writes from its handoff, want 1", n)
			}
		})
	}
}

// A backend's first run of a statement loads the catalog entries of every table and index the statement
// touches and plans it: on a quiet machine 4.7 ms for finish.sql's first run against 0.5 ms for its third,
// and tens of milliseconds on a busy one, which is when a gateway just restarted records its first burst
// of outcomes. A chaos run found every resend in a gateway killed within 30 ms of its first deliveries, its
// first outcome statements taking 80 to 107 ms. So each outcome connection runs the outcome statements once,
// with nothing to record, as it opens: planned here, not inside an outcome's crash window.
func TestAnOutcomeConnectionHasRunItsStatementsBeforeItsFirstOutcome(t *testing.T) {
	t.Parallel()
	_, pool := newStore(t)
	outcomes := outcomePool(t, pool.Config(), PrepareOutcomes, 1, 1)
	rows, err := outcomes.Query(context.Background(),
		`SELECT statement, custom_plans + generic_plans FROM pg_prepared_statements`)
	if err != nil {
		t.Fatal(err)
	}
	planned, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		sql string
		n   int64
	}, error) {
		var p struct {
			sql string
			n   int64
		}
		return p, r.Scan(&p.sql, &p.n)
	})
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int64{}
	for _, p := range planned {
		runs[p.sql] = p.n
	}
	for name, sql := range map[string]string{"pin.sql": pinSQL, "finish.sql": finishSQL, "finish_batch.sql": finishBatchSQL} {
		n, ok := runs[sql]
		switch {
		case !ok:
			t.Errorf("%s is not prepared on an outcome connection", name)
		case n == 0:
			t.Errorf("%s is prepared on an outcome connection but was never run: its first outcome would plan it", name)
		}
	}
}

// An outcome does not wait for an outcome connection to be dialled. When every open one carries a statement,
// it waits for the next statement (the first to end frees a connection, and takes with it every outcome
// that came meanwhile), while the pool dials more in the background: a chaos run's gateways, just restarted
// with 4 of their 5 outcome connections open, held the fifth outcome of a burst 16 to 218 ms for a dial, and
// were killed meanwhile. Here the second connection's dial never ends until the test says so, and the first
// statement is held by a row lock: the second outcome must be handed off on the first connection once the
// lock goes.
func TestAnOutcomeWaitsForTheNextStatementNotForADial(t *testing.T) {
	t.Parallel()
	s0, pool := newStore(t)
	create(t, s0, "held")
	create(t, s0, "next")
	rows, err := s0.Claim(context.Background(), ClaimParams{Type: "typ", Limit: 10, Owner: "me", Lease: time.Minute})
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %d rows, err %v", len(rows), err)
	}
	held, next := rows[0], rows[1]
	if held.Key != "held" {
		held, next = next, held
	}

	gate := make(chan struct{})
	var opened atomic.Int32
	outcomes := outcomePool(t, pool.Config(), func(ctx context.Context, c *pgx.Conn) error {
		if opened.Add(1) > 1 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return PrepareOutcomes(ctx, c)
	}, 1, 2)
	testenv.Eventually(t, 10*time.Second, "the outcome connection opens", func() bool {
		return outcomes.Stat().IdleConns() >= 1
	})
	var closeGate sync.Once
	release := func() { closeGate.Do(func() { close(gate) }) }
	t.Cleanup(release) // before the pool closes: cleanups run last first
	s := NewStore(pool).WithGroupCommit(GroupCommit{MaxBatch: 8, Parallel: 1, Timeout: time.Minute, Outcomes: outcomes})

	lock, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.Background()) }()
	if _, err := lock.Exec(context.Background(), `SELECT 1 FROM oncegate_outbox WHERE effect_id = $1 FOR UPDATE`, held.EffectID); err != nil {
		t.Fatal(err)
	}

	heldOff, nextOff := make(chan struct{}), make(chan struct{})
	finish := func(r Claimed, handedOff chan struct{}) chan error {
		done := make(chan error, 1)
		f := Finish{Status: effect.StatusDelivered, Attempted: true, External: true, OnHandoff: func() { close(handedOff) }}
		go func() { done <- s.Finish(context.Background(), r.Lease, f) }()
		return done
	}
	heldDone := finish(held, heldOff)
	select {
	case <-heldOff:
	case <-time.After(10 * time.Second):
		t.Fatal("the first outcome was not handed off on the open connection")
	}
	nextDone := finish(next, nextOff)
	// The second outcome has nothing to go out on but a connection still being dialled; give it time to
	// (wrongly) take a slot of its own before the first statement ends.
	time.Sleep(200 * time.Millisecond)
	if err := lock.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-heldDone; err != nil {
		t.Fatalf("first outcome: %v", err)
	}
	select {
	case <-nextOff:
	case <-time.After(10 * time.Second):
		t.Fatal("the second outcome waited for a connection being dialled, not for the open one to come free")
	}
	if err := <-nextDone; err != nil {
		t.Fatalf("second outcome: %v", err)
	}
	release()
}

// outcomePool opens a pool of outcome connections as a gateway does (newOutcomePool), closed with the test.
func outcomePool(t *testing.T, cfg *pgxpool.Config, afterConnect func(context.Context, *pgx.Conn) error,
	minConns, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg.AfterConnect = afterConnect
	cfg.MinConns, cfg.MaxConns = minConns, maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// An outcome that meets outcome connections Postgres closed for idling (57P05; a restart's 57P01 is the same)
// is recorded at once on a live one: the pool hands them out without a ping, and each try of record used to
// meet the next dead one only after its back-off (an adversary saw 35 to 360 ms in all, inside the crash
// window). Before that, the first of them made the outcome a failure, and a webhook went out again after its
// lease.
func TestAnOutcomeOnConnectionsClosedForIdlingIsRecordedAtOnce(t *testing.T) {
	t.Parallel()
	s0, pool := newStore(t)
	create(t, s0, "idle")
	row := claimOne(t, s0)
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "200ms"
	outcomes := outcomePool(t, cfg, PrepareOutcomes, 3, 3)
	testenv.Eventually(t, 10*time.Second, "the outcome connections open", func() bool {
		return outcomes.Stat().IdleConns() >= 3
	})
	time.Sleep(700 * time.Millisecond) // Postgres closes the idle connections
	s := NewStore(pool).WithGroupCommit(GroupCommit{MaxBatch: 8, Parallel: 1, Timeout: time.Minute, Outcomes: outcomes})
	f := Finish{Status: effect.StatusDelivered, Attempted: true, External: true}
	if err := s.Finish(context.Background(), row.Lease, f); err != nil {
		t.Fatalf("an outcome on connections closed for idling: %v, want it recorded at the first call", err)
	}
	e, err := s0.Get(context.Background(), "t", "idle")
	if err != nil || e.Status != effect.StatusDelivered {
		t.Fatalf("the effect after its outcome: %+v, %v; want delivered", e, err)
	}
}
