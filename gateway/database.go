package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/dedup"
)

// poolerProbe finds out, once, whether database_url reaches Postgres itself or a pooler that shares server
// connections between its clients (PgBouncer, Odyssey, pgcat, RDS Proxy). A pooler answers the start-up with
// a backend key of its own, so the process ID it hands out is not that of the server process that runs the
// queries (pg_backend_pid()). A TCP proxy passes the start-up through and counts as direct, as it is.
//
// Behind a pooler in transaction mode a connection keeps no prepared statement from one transaction to the
// next, and a LISTEN there hears nothing; behind one in session mode both would work, but the probe cannot
// tell the two modes apart, so it assumes the one that does not break.
type poolerProbe struct {
	cfg *pgx.ConnConfig
	log *slog.Logger

	mu     sync.Mutex
	known  bool
	pooled bool
}

// Pooled reports whether database_url goes through a pooler, connecting once to find out; a failed attempt
// is tried again at the next call.
func (p *poolerProbe) Pooled(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known {
		return p.pooled, nil
	}
	conn, err := pgx.ConnectConfig(ctx, p.cfg)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var pid int64
	// The simple protocol, which every pooler passes whatever its mode.
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, err
	}
	p.known, p.pooled = true, pid != int64(conn.PgConn().PID())
	if p.pooled {
		p.log.Info("database_url goes through a connection pooler (PgBouncer or alike): its backend key is not the server's")
	}
	return p.pooled, nil
}

// newPool opens the pool on database_url (lazily: it connects when first used). Unless the URL chooses a
// default_query_exec_mode, the first connection finds out whether the URL goes through a pooler, and if so
// every connection runs in pgx's exec mode: no prepared statements, which a transaction-pooling PgBouncer
// (1.18, or later without max_prepared_statements) loses between transactions. Every statement of the store
// runs in that mode (dedup's TestEveryStatementRunsInEveryQueryExecMode).
//
// With generic, a connection straight to Postgres keeps generic plans (plan_cache_mode = force_generic_plan,
// unless something chose otherwise: see newOutcomePool). Left to Postgres ("auto"), a statement over the
// partitioned effects is planned again at every run whenever its generic plan, costed as if every partition
// were read, looks dearer than planning it for its parameters: in `scripts/bench retention` Postgres spent
// 22.4 s planning read_payloads.sql against 1.5 s running it, and planned insert.sql at one run in six (2.1
// ms a plan, more than its run), about as much of its time planning as running statements. Every statement
// of a request, a claim and an outcome is written for its generic plan, which dedup's plan tests hold to
// index scans on empty tables; a listing that wants a plan for its filters asks for one (dedup.Store.List).
func newPool(ctx context.Context, c *Config, log *slog.Logger, tune func(*pgxpool.Config),
	generic bool) (*pgxpool.Pool, *poolerProbe, error) {
	pcfg, err := c.poolConfig()
	if err != nil {
		return nil, nil, err
	}
	if tune != nil {
		tune(pcfg)
	}
	probeCfg := pcfg.ConnConfig.Copy()
	probeCfg.Tracer = nil
	probe := &poolerProbe{cfg: probeCfg, log: log}
	dropReadOnly(pcfg, log)
	cc, err := pgconn.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, nil, fmt.Errorf("database_url: %w", err)
	}
	if generic {
		onDirectConnect(pcfg, probe, genericPlansSQL, "database_url: plan_cache_mode")
	}
	if _, chosen := cc.RuntimeParams["default_query_exec_mode"]; !chosen {
		var once sync.Once
		pcfg.BeforeConnect = func(ctx context.Context, conn *pgx.ConnConfig) error {
			pooled, err := probe.Pooled(ctx)
			if err != nil {
				return err
			}
			if pooled {
				conn.DefaultQueryExecMode = pgx.QueryExecModeExec
				once.Do(func() {
					log.Info("queries run in pgx's exec mode, without prepared statements, as a transaction-pooling " +
						"PgBouncer needs; set default_query_exec_mode in database_url to choose another")
				})
			}
			return nil
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("database_url: %w", err)
	}
	return pool, probe, nil
}

// poolConfig is the database pool's configuration: database_url as given, with defaults only for what it
// leaves out. pgxpool fills in a pool_max_conns of its own when the URL has none, so whether the user set
// it is read from the URL itself.
func (c *Config) poolConfig() (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database_url: %w", err)
	}
	cc, err := pgconn.ParseConfig(c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database_url: %w", err)
	}
	if _, set := cc.RuntimeParams["pool_max_conns"]; !set {
		pcfg.MaxConns = DefaultMaxConns
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 { // connect_timeout (or PGCONNECT_TIMEOUT) was not set
		pcfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	return pcfg, nil
}

// readOnlyConns keeps the pool off servers that are no longer the primary: a demoted one, or one a failover
// tool set read-only, which lives on beside the new primary. A pooled connection is checked against
// target_session_attrs only when it is opened, so without this the pool would keep connections there until
// each aged out: writes on them failing, and reads on them answering from a database that no longer changes
// (a test read an effect as it was before the failover on 10 of 40 reads).
//
// So a connection on which a statement was refused as read-only (SQLSTATE 25006) is dropped when it comes
// back (AfterRelease) instead of being handed out again, and dedup counts the refusal as an outage (503,
// retry); and where database_url sets target_session_attrs, a connection handed out is checked against it
// again if it was not for recheckEvery (PrepareConn), and dropped if it fails. A new connection then finds,
// among database_url's hosts, whichever is the primary now.
type readOnlyConns struct {
	log      *slog.Logger
	validate pgconn.ValidateConnectFunc // target_session_attrs' check; nil: none
	marked   sync.Map                   // *pgx.Conn → struct{}: met a 25006
	checked  sync.Map                   // *pgx.Conn → time.Time: when it last passed validate
}

// recheckEvery is how long a pooled connection goes unchecked against target_session_attrs: the longest a
// server's demotion goes unnoticed by a connection that only reads. A check is one round trip.
const recheckEvery = time.Second

// dropReadOnly has the pool configured by pcfg drop the connections on servers that are no longer the
// primary. It keeps the pool's tracer, if any, and its hooks.
func dropReadOnly(pcfg *pgxpool.Config, log *slog.Logger) {
	r := &readOnlyConns{log: log, validate: pcfg.ConnConfig.ValidateConnect}
	if t := pcfg.ConnConfig.Tracer; t != nil {
		pcfg.ConnConfig.Tracer = multitracer.New(t, r)
	} else {
		pcfg.ConnConfig.Tracer = r
	}
	afterConnect, prepare, afterRelease, beforeClose := pcfg.AfterConnect, pcfg.PrepareConn, pcfg.AfterRelease, pcfg.BeforeClose
	pcfg.AfterRelease = func(c *pgx.Conn) bool {
		if _, marked := r.marked.LoadAndDelete(c); marked {
			r.log.Warn("dropping a database connection: the server refused a write as read-only (SQLSTATE 25006), " +
				"so it is not the primary (demoted in a failover?); the next connection looks for the primary " +
				"among database_url's hosts (target_session_attrs=read-write)")
			return false
		}
		return afterRelease == nil || afterRelease(c)
	}
	pcfg.BeforeClose = func(c *pgx.Conn) {
		r.marked.Delete(c)
		r.checked.Delete(c)
		if beforeClose != nil {
			beforeClose(c)
		}
	}
	if r.validate == nil {
		return
	}
	pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		r.checked.Store(c, time.Now()) // pgconn validated it as it connected
		if afterConnect != nil {
			return afterConnect(ctx, c)
		}
		return nil
	}
	pcfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		if prepare != nil {
			if ok, err := prepare(ctx, c); !ok || err != nil {
				return ok, err
			}
		}
		if at, ok := r.checked.Load(c); ok && time.Since(at.(time.Time)) < recheckEvery {
			return true, nil
		}
		if err := r.validate(ctx, c.PgConn()); err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			r.log.Warn("dropping a database connection: its server no longer passes database_url's "+
				"target_session_attrs (demoted in a failover?); the next connection looks for one that does", "err", err)
			return false, nil // pgxpool tries another connection, or opens one
		}
		r.checked.Store(c, time.Now())
		return true, nil
	}
}

func (r *readOnlyConns) mark(c *pgx.Conn, err error) {
	if dedup.ReadOnly(err) {
		r.marked.Store(c, struct{}{})
	}
}

func (r *readOnlyConns) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (r *readOnlyConns) TraceQueryEnd(_ context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	r.mark(c, d.Err)
}

func (r *readOnlyConns) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *readOnlyConns) TraceBatchQuery(_ context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.mark(c, d.Err)
}

func (r *readOnlyConns) TraceBatchEnd(_ context.Context, c *pgx.Conn, d pgx.TraceBatchEndData) {
	r.mark(c, d.Err)
}

func (r *readOnlyConns) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	return ctx
}

func (r *readOnlyConns) TraceCopyFromEnd(_ context.Context, c *pgx.Conn, d pgx.TraceCopyFromEndData) {
	r.mark(c, d.Err)
}

// outcomeShare is how many connections, of a pool of total, are kept for recording the outcomes of effects
// that happened outside the database (dedup.GroupCommit.Outcomes): as many as the dispatcher's outcome
// statements in flight at most (parallel, and three times as many in reserve for them), and at most a
// quarter of the pool, carved out of it so that pool_max_conns still bounds what a gateway opens. None in a
// pool too small to spare them.
// warmFor bounds the wait for the outcome connections at start: a database slow to answer delays no start
// for long, and the connections not open by then open when first needed.
const warmFor = 2 * time.Second

func outcomeShare(total int32, parallel int) int32 {
	n := int32(4 * max(parallel, 1))
	if total/4 < n {
		n = total / 4
	}
	return n
}

// onDirectConnect has each connection of pcfg run sql as it opens, after pcfg's own AfterConnect, where it
// reaches Postgres itself (probe): through a pooler a session setting would stay on a server connection other
// clients are handed. what names a failure.
func onDirectConnect(pcfg *pgxpool.Config, probe *poolerProbe, sql, what string) {
	afterConnect := pcfg.AfterConnect
	pcfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if afterConnect != nil {
			if err := afterConnect(ctx, c); err != nil {
				return err
			}
		}
		pooled, err := probe.Pooled(ctx)
		if err != nil || pooled {
			return err
		}
		if _, err := c.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
}

// genericPlansSQL makes the session keep generic plans, unless its plan_cache_mode was chosen already: by
// database_url's options, PGOPTIONS, the role, the database or the server's configuration, auto included
// (an explicit auto read as the default was overridden).
const genericPlansSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', false)
FROM pg_settings WHERE name = 'plan_cache_mode' AND source = 'default'`

// newOutcomePool opens the outcome connections: the main pool's configuration (its hooks, exec mode and
// failover checks), at most n connections, each with the statements that record outcomes prepared as it
// opens, and run once (dedup.PrepareOutcomes). Until the statement recording an outcome is written, a gateway
// killed resends the effect; so that statement must not wait for a connection that requests hold, nor for one
// to be dialled (an outcome that finds every open one busy goes in the next statement, while the rest are
// dialled in the background: dedup's group), nor for a round trip to prepare it on a new one, nor for its
// first planning (a chaos run saw a gateway just restarted hold an outcome 42 ms for a new connection, and be
// killed meanwhile). Up to twice group_commit.parallel (the
// statements a steady load keeps in flight, and as many again for a burst) are opened at start and kept open,
// and the gateway waits, at most warmFor, for them before it claims a row. Half of a small share, as before,
// left a gateway's first bursts to dial the rest under load, 100 to 300 ms each on a busy 2-core machine: in
// chaos runs (gateways of 5 outcome connections, each living a few seconds) the outcomes' handoff p99 was 210
// to 230 ms with 2 opened at start and 38 ms with all 5, and resends per gateway kill 0.50 to 0.52 against
// 0.32. Not more: each is a server process, and the test suite's gateways, starting together, took 93 of a
// Postgres's 100 connections with all 8 of the default share opened at start.
//
// Nor does an outcome wait for its statement to be planned: on a connection straight to Postgres, the
// outcome connections run with plan_cache_mode = force_generic_plan as the main pool's do (newPool, whose
// AfterConnect they share), unless something chose otherwise (database_url, its options, the role's or the
// database's settings). Left to Postgres, finish.sql was
// planned again for each outcome, its generic plan being costed as an update of every partition of the
// effects: 200 µs of Postgres's CPU an outcome on a new database, beside 100 µs to run it, and more with each
// partition kept. The generic plan finds the effect's partition as it starts (the id is a parameter), and
// the three statements these connections run have their generic plans held to index scans by dedup's plan
// tests. Not through a pooler: the setting would stay on a server connection other clients share.
func newOutcomePool(main *pgxpool.Pool, n, warm int32, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg := main.Config()
	cfg.MaxConns, cfg.MinConns = n, min(n, warm)
	cfg.MaxConnLifetimeJitter = cfg.MaxConnLifetime / 4 // renewed one at a time, not all at once
	// Taken without a check: pgxpool's ping of a connection idle over a second, and the recheck against
	// target_session_attrs (dropReadOnly's PrepareConn), are each a round trip before the outcome's statement
	// is written, inside the crash window, and outcome connections idle between bursts. A connection that
	// died, or a server now read-only, fails the statement itself, which record tries again on another
	// connection (a read-only one is dropped as it comes back: AfterRelease).
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.PrepareConn = nil
	afterConnect := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if afterConnect != nil {
			if err := afterConnect(ctx, c); err != nil {
				return err
			}
		}
		return dedup.PrepareOutcomes(ctx, c)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("database_url: outcome connections: %w", err)
	}
	start := time.Now()
	for end := start.Add(warmFor); pool.Stat().IdleConns() < cfg.MinConns && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	log.Debug("outcome connections opened", "open", pool.Stat().IdleConns(), "wanted", cfg.MinConns, "of", n,
		"took", time.Since(start))
	return pool, nil
}
