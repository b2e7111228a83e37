// Package partitions keeps tables partitioned by time (PARTITION BY RANGE on a timestamptz column, or on an
// effect id, which tells its time; plain Postgres declarative partitioning) in shape: it creates their
// partitions ahead of time and retires those whose whole range is past retention, by DETACH PARTITION ...
// CONCURRENTLY and DROP TABLE, instead of a batched DELETE (issue 30).
//
// What it guarantees:
//   - One manager works at a time in a database: a pass runs only while its manager holds a session
//     advisory lock (LockKey) on a connection of its own, which must reach Postgres directly or through a
//     session-mode pooler (never PgBouncer in transaction mode, where a session lock lands on a pooled
//     server connection). A manager killed releases it with its connection.
//   - Its DDL never holds off writes for long: every statement runs with lock_timeout (Config.LockTimeout),
//     and one that times out is retried with backoff, then left to the next pass. Partitions are created
//     apart and attached (SHARE UPDATE EXCLUSIVE on the table, which inserts do not wait for) and detached
//     CONCURRENTLY.
//   - A detach interrupted (the gateway killed, its wait timed out) leaves the partition "detach pending";
//     the next pass finishes it (FINALIZE) and drops it, and drops a detached partition whose DROP did not
//     run.
//   - A partition is retired only when its whole range ends before now - retention and its table's Keep
//     query says nothing in it must stay: for effects, none is still on its way (an outbox row) and none
//     finished less than retention ago; for replays and attempts, none is of an effect still stored. The
//     keys pointing at a partition of effects are freed first (FreeKeys), and a partition of effects that
//     gained an outbox row while it was being detached is attached again, not dropped.
//
// There is no DEFAULT partition: DETACH ... CONCURRENTLY refuses a table that has one. An insert needs its
// partition to exist, so partitions are created Config.Ahead intervals ahead, and a pass that finds the
// newest partition ending less than one interval ahead says so (an error log, and Report.Short).
package partitions

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

func sqlFile(name string) string {
	b, err := sqlFiles.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic(err)
	}
	return string(b)
}

var (
	listSQL      = sqlFile("list")
	leftoversSQL = sqlFile("leftovers")
	createSQL    = sqlFile("create")
	attachSQL    = sqlFile("attach")
	detachSQL    = sqlFile("detach")
	finalizeSQL  = sqlFile("finalize")
	dropSQL      = sqlFile("drop")
	settingsSQL  = sqlFile("settings")
)

// Table is a table partitioned by RANGE on a timestamptz column or on an effect id.
type Table struct {
	// Name is the partitioned table. Its partitions are named Name_pYYYYMMDDtHHMMSS after their lower bound
	// (UTC).
	Name string
	// ByEffectID: the partition key is an effect id (migration 00023), and a partition for [t1, t2) is
	// [EffectID(t1), EffectID(t2)).
	ByEffectID bool
	// Keep, if not empty, is a query answering one boolean: whether a partition past retention must be kept
	// still. In it, {{partition}} is replaced by the partition's name, {{lower}} and {{upper}} by its bounds
	// (as the partition key's literals), and {{retention_ms}} by the retention in milliseconds.
	Keep string
	// Stray, if not empty, is asked again once the partition is detached (with Keep's placeholders): true
	// attaches it again instead of dropping it.
	Stray string
	// FreeKeys, when set, runs before a partition is detached: it frees the keys pointing at the partition's
	// rows (oncegate_effects: dedup.FreePartitionKeys, which alone may write keys). held keeps the partition.
	FreeKeys FreeKeysFunc
	// RestoreKeys, when set, runs when a partition whose keys FreeKeys freed is kept after all, or attached
	// again: it puts back the keys of its rows that are in use again (dedup.RestorePartitionKeys).
	RestoreKeys RestoreKeysFunc
	// With is the storage parameters of its partitions ("fillfactor = 70"), if any.
	With string
	// Retention, if positive, is this table's own, shorter than Config.Retention (bodies: retention.payloads);
	// otherwise the table's partitions are retired after Config.Retention.
	Retention time.Duration
}

// retention is how long t's partitions are kept past their range.
func (t Table) retention(c Config) time.Duration {
	if t.Retention > 0 {
		return t.Retention
	}
	return c.Retention
}

// FreeKeysFunc frees the keys pointing at a partition's rows, on the manager's connection.
type FreeKeysFunc func(ctx context.Context, conn *pgx.Conn, partition string, retention time.Duration) (freed int64,
	held bool, err error)

// RestoreKeysFunc puts back the keys of a partition's rows in use again, on the manager's connection.
// The rows in use are found by the partition's id range, [lower, upper).
type RestoreKeysFunc func(ctx context.Context, conn *pgx.Conn, partition string, lower, upper int64) (restored int64,
	err error)

// Effects is oncegate_effects (migration 00023): a partition is kept while an effect in it is not terminal
// or finished less than retention ago. A manager retiring its partitions must free their keys first: New
// refuses it without FreeKeys (Tables sets it).
var Effects = Table{Name: "oncegate_effects", ByEffectID: true, Keep: sqlFile("keep_effects"),
	Stray: sqlFile("stray_effects")}

// Replays is oncegate_effect_replays (migration 00023), partitioned as the effects are: a partition is kept
// while an effect of its range is stored.
var Replays = Table{Name: "oncegate_effect_replays", ByEffectID: true, Keep: sqlFile("keep_replays"),
	With: "fillfactor = 70"}

// Bodies is oncegate_effect_bodies (migration 00025): the payloads and stored answers written apart when
// retention.payloads is set, partitioned as the effects are. A partition past its retention (Tables' bodies) is
// kept while an effect of its range is on its way (an outbox row: its payload is still to be sent) or
// finished less than that retention ago, and attached again if an outbox row appears while it is detached
// (an operator's retry). Its effects stay: they say that an effect happened, with whom and when, and that
// its body expired.
var Bodies = Table{Name: "oncegate_effect_bodies", ByEffectID: true, Keep: sqlFile("keep_bodies"),
	Stray: sqlFile("stray_effects")}

// Attempts is oncegate_effect_attempts (migration 00019): a partition is kept while an attempt in it is of
// an effect that is still stored.
var Attempts = Table{Name: "oncegate_effect_attempts", Keep: sqlFile("keep_attempts")}

// All is every table the gateway partitions, in the order a pass takes them: a partition of replays or
// attempts goes in the pass that dropped its effects. For Ensure; a manager takes Tables(...).
var All = []Table{Effects, Replays, Bodies, Attempts}

// Tables is All, with the effects' keys freed by freeKeys (dedup.FreePartitionKeys) and put back by
// restoreKeys (dedup.RestorePartitionKeys), and bodies retired after bodies (retention.payloads; 0: with their
// effects).
func Tables(freeKeys FreeKeysFunc, restoreKeys RestoreKeysFunc, bodies time.Duration) []Table {
	e := Effects
	e.FreeKeys, e.RestoreKeys = freeKeys, restoreKeys
	b := Bodies
	b.Retention = bodies
	return []Table{e, Replays, b, Attempts}
}

// effectIDEpoch is the instant effect ids count their seconds from (2025-01-01 UTC), and effectIDShift the
// bits below the seconds (migration 00023, oncegate_next_effect_id).
const (
	effectIDEpoch = 1735689600
	effectIDShift = 22
)

// EffectID is the lowest id an effect made at t can have: a partition bound of oncegate_effects.
func EffectID(t time.Time) int64 { return (t.Unix() - effectIDEpoch) << effectIDShift }

// EffectTime is the second an effect id was made in (for ids of migration 00023 and later).
func EffectTime(id int64) time.Time { return time.Unix(effectIDEpoch+id>>effectIDShift, 0).UTC() }

// Defaults.
const (
	// DefaultInterval is the range of one partition.
	DefaultInterval = 24 * time.Hour
	// DefaultAhead is how many intervals past the present are kept created.
	DefaultAhead = 3
	// DefaultLockTimeout is each DDL statement's lock_timeout.
	DefaultLockTimeout = 100 * time.Millisecond
	// DefaultRetries is how often a statement whose lock timed out is tried again within a pass.
	DefaultRetries = 8
	// LockKey is the session advisory lock that one manager at a time holds (pg_try_advisory_lock).
	LockKey int64 = 0x6f6e6365_70617274 // "oncepart"
)

// Config configures a Manager.
type Config struct {
	// ConnString reaches the database directly, or through a session-mode pooler: the manager's advisory lock
	// is a session's. Required.
	ConnString string
	// Tables to manage, in order: Tables(dedup.FreePartitionKeys) for the gateway's. Required.
	Tables []Table
	// Interval is the range of one partition; partitions start on multiples of it counted as time.Truncate
	// counts (UTC midnights for a day, whole minutes for a minute). Defaults to DefaultInterval.
	Interval time.Duration
	// Ahead is how many intervals past the present are kept created. Defaults to DefaultAhead.
	Ahead int
	// Retention: a partition whose range ends more than this before now is retired. Required.
	Retention time.Duration
	// Every is how often a pass runs. Defaults to a quarter of Interval, at most an hour.
	Every time.Duration
	// LockTimeout is each DDL statement's lock_timeout. Defaults to DefaultLockTimeout.
	LockTimeout time.Duration
	// Retries is how often a statement whose lock timed out is tried again, with backoff, within a pass.
	// Defaults to DefaultRetries.
	Retries int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now; tests move the clock.
	Now func() time.Time
	// Fleet, when set, makes every pass run with the fleet's settings only (Settings: the interval, ahead and
	// retentions), kept in oncegate_partition_settings (migration 00029): the first manager's become the
	// fleet's; a manager whose own differ runs no pass (ErrOtherSettings) while a gateway alive, by its
	// heartbeat's partition_settings, runs with the fleet's, and takes them over once none does. Owner names
	// this gateway in that table. The gateway sets it; unset, a manager runs with its own (tests).
	Fleet bool
	Owner string
	// LiveWithin is how recent a gateway's heartbeat must be for it to count as alive. Defaults to
	// DefaultLiveWithin.
	LiveWithin time.Duration
}

// DefaultLiveWithin is three of the gateway's heartbeats (5 s each).
const DefaultLiveWithin = 15 * time.Second

// ErrOtherSettings is returned by Pass when the fleet runs with other partition settings than this manager's
// (Config.Fleet) and a gateway alive runs with them: the pass did nothing.
var ErrOtherSettings = errors.New("partitions: the fleet's partition settings are not this gateway's")

// Settings is what a pass's shape depends on, as one text, in the gateway configuration's words: the
// interval, how many ahead, the retention, and each table's own retention (the bodies': retention.payloads).
// Two managers with the same Settings make and retire the same partitions.
func (c Config) Settings() string {
	c = c.WithDefaults()
	s := fmt.Sprintf("partitions.interval=%s partitions.ahead=%d retention.keys=%s", c.Interval, c.Ahead, c.Retention)
	for _, t := range c.Tables {
		if t.Retention > 0 {
			name := t.Name + ".retention"
			if t.Name == Bodies.Name {
				name = "retention.payloads"
			}
			s += fmt.Sprintf(" %s=%s", name, t.Retention)
		}
	}
	return s
}

// WithDefaults returns the config with its unset fields defaulted.
func (c Config) WithDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Ahead <= 0 {
		c.Ahead = DefaultAhead
	}
	if c.Every <= 0 {
		c.Every = min(c.Interval/4, time.Hour)
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.Retries <= 0 {
		c.Retries = DefaultRetries
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.LiveWithin <= 0 {
		c.LiveWithin = DefaultLiveWithin
	}
	return c
}

func (c Config) validate() error {
	if c.ConnString == "" {
		return errors.New("partitions: a connection string is required")
	}
	if c.Retention <= 0 {
		return errors.New("partitions: retention must be positive")
	}
	if len(c.Tables) == 0 {
		return errors.New("partitions: no table to manage")
	}
	for _, t := range c.Tables {
		if t.Name == Effects.Name && (t.FreeKeys == nil || t.RestoreKeys == nil) {
			return errors.New("partitions: oncegate_effects needs its keys freed and put back " +
				"(Tables(dedup.FreePartitionKeys, dedup.RestorePartitionKeys, ...))")
		}
	}
	if c.Interval < time.Second || c.Interval%time.Second != 0 {
		return errors.New("partitions: the interval must be a whole number of seconds (effect ids count seconds)")
	}
	return nil
}

// ErrNotHeld is returned by Pass when another manager holds the lock.
var ErrNotHeld = errors.New("partitions: another manager holds the lock")

// Report says what a pass did.
type Report struct {
	Created   []string      // partitions created
	Finalized []string      // pending detaches finished
	Dropped   []string      // partitions (and leftovers of earlier detaches) dropped
	Kept      []string      // partitions past retention kept, because of their Keep query (or a key still held)
	Freed     int64         // keys freed with the partitions of effects retired
	Took      time.Duration // the pass's length, as Run measured it
	// Steps is the pass's work one step at a time, in order, with when each began: what a request slowed
	// during a pass was slowed by (scripts/bench retention sorts its latencies by them). The log also sums
	// them by kind (spent_ms).
	Steps []Step
	// Short names the tables whose newest partition ends less than one interval ahead: inserts past it fail
	// if the manager does not run again before then.
	Short []string
}

// Step is one piece of a pass's work on one table.
type Step struct {
	// Kind: "create", "keep" (the Keep queries), "keys" (FreeKeys), "detach", "drop".
	Kind  string        `json:"kind"`
	Table string        `json:"table"`
	At    time.Time     `json:"at"`
	Took  time.Duration `json:"took_ns"`
}

// spend records a step of kind on table that began at began and ends now.
func (r *Report) spend(kind, table string, began time.Time) {
	r.Steps = append(r.Steps, Step{Kind: kind, Table: table, At: began, Took: time.Since(began)})
}

// Manager keeps the tables' partitions.
type Manager struct {
	cfg  Config
	conn *pgx.Conn // holds the lock while the manager works
	// was is the fleet's retentions before the last takeover of its settings, a floor under this pass's own
	// until wasUntil (settle): what was stored under them was promised them.
	was      Retentions
	wasUntil time.Time
}

// New returns a manager; it connects when it runs.
func New(cfg Config) (*Manager, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Manager{cfg: cfg}, nil
}

// Run makes a pass every Config.Every until ctx ends, taking the lock when no other manager holds it. The
// lock and its connection are let go between passes: a connection held for minutes to do milliseconds of
// work a minute is one a fleet's Postgres cannot give a request (a test suite starting many gateways ran out
// of max_connections), and whichever gateway takes the lock next does the next pass as well.
func (m *Manager) Run(ctx context.Context) {
	defer m.Close()
	var said time.Time // when ErrOtherSettings was last logged
	for {
		began := time.Now()
		rep, err := m.Pass(ctx)
		rep.Took = time.Since(began)
		m.Close()
		next := m.cfg.Every
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrNotHeld):
		case errors.Is(err, ErrOtherSettings):
			// Asked again soon, not a quarter of an interval later (six hours for days): the settings are taken
			// over once the last gateway with the fleet's is gone. Said every ten minutes, not at every ask.
			next = min(next, 2*m.cfg.LiveWithin)
			if time.Since(said) >= 10*time.Minute {
				said = time.Now()
				m.cfg.Logger.Error("partitions: this gateway's settings are not the fleet's; it leaves partitions "+
					"to the gateways that run with the fleet's", "err", err)
			}
		case err != nil:
			m.cfg.Logger.Warn("partitions: pass failed; trying again at the next", "err", err,
				"next_in", m.cfg.Every.String())
			m.logReport(rep) // what it did before, and a table running out of partitions
		default:
			m.logReport(rep)
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (m *Manager) logReport(rep Report) {
	if len(rep.Created)+len(rep.Finalized)+len(rep.Dropped) > 0 {
		m.cfg.Logger.Info("partitions: pass", "created", rep.Created, "finalized", rep.Finalized,
			"dropped", rep.Dropped, "keys_freed", rep.Freed, "took_ms", rep.Took.Milliseconds(),
			"spent_ms", spentMS(rep.Steps), "steps", rep.Steps)
	}
	if len(rep.Kept) > 0 {
		m.cfg.Logger.Info("partitions: kept past retention, for rows still in use", "kept", rep.Kept)
	}
	if len(rep.Short) > 0 {
		m.cfg.Logger.Error("partitions: the newest partition ends less than one interval ahead; inserts past "+
			"it will fail", "tables", rep.Short, "interval", m.cfg.Interval.String())
	}
}

// Close releases the connection, and with it the lock.
func (m *Manager) Close() {
	if m.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.conn.Close(ctx)
		m.conn = nil
	}
}

// Pass takes the lock (or finds it held by this manager) and runs one pass: it finishes interrupted
// detaches, creates partitions ahead, and retires those past retention. ErrNotHeld: another manager holds
// the lock, and the pass did nothing.
func (m *Manager) Pass(ctx context.Context) (Report, error) {
	if m.conn != nil && m.conn.IsClosed() {
		m.conn = nil
	}
	if m.conn == nil {
		// Parsed as a pool's, so that a database_url's pool settings (pool_max_conns, …) are taken out
		// rather than sent to the server as parameters it does not know.
		pcfg, err := pgxpool.ParseConfig(m.cfg.ConnString)
		if err != nil {
			return Report{}, fmt.Errorf("partitions: connection string: %w", err)
		}
		conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig)
		if err != nil {
			return Report{}, fmt.Errorf("partitions: connect: %w", err)
		}
		var held bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", LockKey).Scan(&held); err != nil || !held {
			_ = conn.Close(ctx)
			if err != nil {
				return Report{}, fmt.Errorf("partitions: take the lock: %w", err)
			}
			return Report{}, ErrNotHeld
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d; SET TimeZone = 'UTC'",
			m.cfg.LockTimeout.Milliseconds())); err != nil {
			_ = conn.Close(ctx)
			return Report{}, fmt.Errorf("partitions: set lock_timeout: %w", err)
		}
		m.conn = conn
	}
	if m.cfg.Fleet {
		if err := m.settle(ctx); err != nil {
			return Report{}, err
		}
	}
	var rep Report
	// Partitions ahead first, for every table, whatever happens to retirement after: an insert needs its
	// partition, while retiring one can wait. A reader holding a table makes a detach (or its FINALIZE) time
	// out, and a pass that stopped there made no partition ahead: inserts failed once the newest ended.
	var errs []error
	if err := m.ahead(ctx, &rep); err != nil {
		// Retiring goes on all the same: a table that keeps failing its partitions ahead (a table in the way
		// of a name, a lock held) held off every table's retirement, and the effects' and keys' grew while
		// only the error log said so. The tables running short are said below.
		if ctx.Err() != nil || m.conn.IsClosed() {
			return rep, err
		}
		errs = append(errs, err)
	}
	for _, t := range m.cfg.Tables {
		if err := m.table(ctx, t, &rep); err != nil {
			errs = append(errs, err)
			if t.Name == Effects.Name {
				// The other tables' Keep asks whether an effect of a range is stored, and an effects' partition
				// left pending detach (its FINALIZE timed out behind a reader) hides its effects from that
				// question though they are still there: a pass dropped the replays' partition of that very
				// range (an outside test). They wait for the next pass.
				break
			}
			// Otherwise the next table's retirement is its own.
		}
	}
	return rep, errors.Join(append(errs, m.short(ctx, &rep))...)
}

// Settings is the settings this manager runs passes with (Config.Settings).
func (m *Manager) Settings() string { return m.cfg.Settings() }

// retention is how long t's partitions are kept past their range in this pass: t's own retention, or, until
// the longest retention of the fleet's settings before the last takeover has passed since it, that one's
// where it is longer. A takeover is no decision to shorten what is stored: an outside tester's canary took a
// fleet's settings over 20 s after the last gateway with them was SIGKILLed, and dropped effects the fleet
// had promised to keep for two minutes more.
func (m *Manager) retention(t Table) time.Duration {
	r := t.retention(m.cfg)
	if !m.cfg.Now().Before(m.wasUntil) {
		return r
	}
	return max(r, m.was.of(t))
}

// longer says whether the retentions r keep some table's partitions longer than this manager's own do.
func (m *Manager) longer(r Retentions) bool {
	for _, t := range m.cfg.Tables {
		if r.of(t) > t.retention(m.cfg) {
			return true
		}
	}
	return false
}

// floor is the retentions a takeover now would keep as a floor (settings.sql's $4), as a settings text: the
// fleet's settings, each retention raised to an earlier takeover's floor while that is in force. nil: no
// settings yet, or none to raise (the fleet's own then).
func (m *Manager) floor(ctx context.Context) (*string, error) {
	fr, ok, err := readFleet(ctx, m.conn)
	if !ok || err != nil {
		return nil, err
	}
	old, inForce := fr.floor()
	cur, err := ParseRetentions(fr.settings)
	if !inForce || err != nil {
		return nil, nil
	}
	f := fmt.Sprintf("retention.keys=%s retention.payloads=%s", max(cur.Keys, old.Keys),
		max(cur.of(Bodies), old.of(Bodies)))
	return &f, nil
}

// settle makes sure that the pass runs with the fleet's settings (Config.Fleet): it records this manager's
// as the fleet's when there are none yet, or when no gateway alive runs with the fleet's any more, and
// returns ErrOtherSettings while one does.
func (m *Manager) settle(ctx context.Context) error {
	mine := m.cfg.Settings()
	// Should this manager take the settings over, the floor it records (was): the fleet's settings now, or,
	// where longer, an earlier takeover's floor still in force. Recording the old settings alone let a second
	// takeover within the first's window forget the first's longer retention (an outside test: a canary
	// restarted twice cut the fleet's 2 minutes to 90 s). Read under the manager's lock, as the write is.
	floor, err := m.floor(ctx)
	if err != nil {
		return err
	}
	var fleet, by, was *string
	var at, takenAt *time.Time
	var holders int
	var ours bool
	if err := m.conn.QueryRow(ctx, settingsSQL, mine, m.cfg.Owner, m.cfg.LiveWithin.Seconds(), floor).
		Scan(&fleet, &by, &at, &holders, &ours, &was, &takenAt); err != nil {
		return fmt.Errorf("partitions: the fleet's settings: %w", err)
	}
	m.was, m.wasUntil = Retentions{}, time.Time{}
	if ours && was != nil && takenAt != nil {
		if r, err := ParseRetentions(*was); err != nil {
			m.cfg.Logger.Warn("partitions: the fleet's settings before the last takeover cannot be read; "+
				"this pass keeps to the fleet's own", "err", err)
		} else if until := takenAt.Add(max(r.Keys, r.Payloads)); m.cfg.Now().Before(until) && m.longer(r) {
			m.was, m.wasUntil = r, until
		}
	}
	switch {
	case ours && fleet == nil:
		m.cfg.Logger.Info("partitions: the fleet runs with this gateway's partition settings", "settings", mine)
	case ours && *fleet != mine:
		log := m.cfg.Logger.With("settings", mine, "were", *fleet, "set_by", *by)
		if !m.wasUntil.IsZero() {
			// What was stored under the old ones keeps their retentions where longer (retention).
			log = log.With("old_retentions_kept_until", m.wasUntil.UTC().Format(time.RFC3339))
		}
		log.Warn("partitions: the fleet's partition settings are this gateway's now: no gateway alive runs with the old ones")
	case !ours:
		return fmt.Errorf("%w: this gateway's are %q, the fleet's %q (set by %s at %s) and %d gateways alive run "+
			"with them; it makes and retires no partition until none does (docs/storage.md)", ErrOtherSettings,
			mine, *fleet, *by, at.UTC().Format(time.RFC3339), holders)
	}
	return nil
}

// short notes in rep.Short the tables whose newest partition ends less than one interval ahead.
func (m *Manager) short(ctx context.Context, rep *Report) error {
	for _, t := range m.cfg.Tables {
		ps, err := list(ctx, m.conn, t)
		if err != nil {
			return err
		}
		if len(ps) == 0 || ps[len(ps)-1].upper != nil && ps[len(ps)-1].upper.Before(m.cfg.Now().Add(m.cfg.Interval)) {
			rep.Short = append(rep.Short, t.Name)
		}
	}
	return nil
}

// ahead creates every table's partitions up to Ahead intervals past now, in one transaction. Each ATTACH
// makes every connection plan again each statement that reads its table, as its generic plan names every
// partition (1 to 7 ms of Postgres's CPU a statement over 4 to 14 partitions, on a quiet machine): the
// tables attached one after the other sent as many waves of plans a pass, a few ms apart, and one commit
// sends one.
//
// One table whose partitions cannot be made (its lock held past the retries, a table in the way of a name)
// must not leave the others without theirs: when the one transaction fails, each table's are made in a
// transaction of its own, and the errors are the failing tables'.
func (m *Manager) ahead(ctx context.Context, rep *Report) error {
	type todo struct {
		table        string
		stmts, names []string
	}
	var all []todo
	for _, t := range m.cfg.Tables {
		ps, err := list(ctx, m.conn, t)
		if err != nil {
			return err
		}
		if m.oversize(ps, m.cfg.Now()) {
			switch done, err := m.fresh(ctx, t, rep); {
			case err != nil:
				// Left as it is: the table works with its long partition, as before.
				m.cfg.Logger.Warn("partitions: could not give an empty table partitions of the interval; it "+
					"keeps its first partitions until they end", "table", t.Name, "err", err)
			case done:
				if ps, err = list(ctx, m.conn, t); err != nil {
					return err
				}
			}
		}
		if qs, names := m.creates(t, ps, m.cfg.Now()); len(qs) > 0 {
			all = append(all, todo{t.Name, qs, names})
		}
	}
	run := func(group []todo, retries int) error {
		var stmts, names, tables []string
		for _, td := range group {
			stmts, names, tables = append(stmts, td.stmts...), append(names, td.names...), append(tables, td.table)
		}
		began := time.Now()
		err := m.ddlTries(ctx, strings.Join(stmts, "\n"), retries)
		rep.spend("create", strings.Join(tables, ","), began)
		if err == nil {
			rep.Created = append(rep.Created, names...)
		}
		return err
	}
	if len(all) == 0 {
		return nil
	}
	if len(all) == 1 {
		return run(all, m.cfg.Retries)
	}
	// Tried once: a lock held on one table is waited for with retries by that table's own transaction, not
	// by everyone's (an outside tester's lock on the replays held the effects' partition back 9.5 s a pass).
	err := run(all, 0)
	if err == nil || ctx.Err() != nil {
		return err
	}
	var errs []error
	for _, td := range all {
		if err := run([]todo{td}, m.cfg.Retries); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// oversize reports whether the newest partition ends more than an interval past where the manager makes
// partitions ahead to: a new database's first partitions (the migrations', which run to the start of the day
// after tomorrow whatever the interval: migrations are SQL and know no configuration), or a longer interval's.
func (m *Manager) oversize(ps []partition, now time.Time) bool {
	if len(ps) == 0 || ps[len(ps)-1].upper == nil {
		return false
	}
	iv := m.cfg.Interval
	until := now.UTC().Add(iv / 2).Truncate(iv).Add(time.Duration(m.cfg.Ahead+1) * iv)
	return ps[len(ps)-1].upper.After(until.Add(iv))
}

// fresh gives a table that holds no row partitions of the interval from the present one on, in place of those
// it has: on a database just made, an interval shorter than a day took effect only once the migrations' first
// partitions had ended, two days on, and an operator could not rehearse retention on a database of their own
// (an outside tester's finding). A table with a row keeps its partitions, which end in their time. The table
// is looked at first without a lock, so that a busy table is never locked for it; then under ACCESS
// EXCLUSIVE (within lock_timeout: an insert waits that long at most) and looked at again, so that no row
// written meanwhile goes with a partition.
func (m *Manager) fresh(ctx context.Context, t Table, rep *Report) (bool, error) {
	parent := pgx.Identifier{t.Name}.Sanitize()
	empty := "SELECT NOT EXISTS (SELECT 1 FROM " + parent + ")"
	var ok bool
	if err := m.conn.QueryRow(ctx, empty).Scan(&ok); err != nil || !ok {
		return false, err
	}
	began := time.Now()
	tx, err := m.conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+parent+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		return false, err
	}
	if err := tx.QueryRow(ctx, empty).Scan(&ok); err != nil || !ok {
		return false, err
	}
	ps, err := list(ctx, tx, t)
	if err != nil || slices.ContainsFunc(ps, func(p partition) bool { return p.pending }) {
		return false, err // a detach pending is finished by the pass first
	}
	var stmts []string
	for _, p := range ps {
		stmts = append(stmts, "DROP TABLE "+pgx.Identifier{p.name}.Sanitize()+";")
	}
	// From the interval before the present one: an effect id made a moment ago, on a clock a little behind this
	// one, still has its partition. The pass's creates after this one add what is ahead.
	creates, names := m.creates(t, nil, m.cfg.Now().Add(-m.cfg.Interval))
	if _, err := tx.Exec(ctx, strings.Join(append(stmts, creates...), "\n")); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	rep.spend("create", t.Name, began)
	rep.Created = append(rep.Created, names...)
	for _, p := range ps {
		rep.Dropped = append(rep.Dropped, p.name)
	}
	m.cfg.Logger.Info("partitions: an empty table's partitions are now of the interval", "table", t.Name,
		"interval", m.cfg.Interval, "dropped", len(ps), "created", names)
	return true, nil
}

type partition struct {
	name         string
	pending      bool
	lower, upper *time.Time // nil: MINVALUE, MAXVALUE
}

// querier is a connection or a pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Covers reports whether a partition of t (attached, not pending detach) takes rows made at at: whether an
// effect (or attempt) could be written then. A gateway's /readyz asks it of the present.
func Covers(ctx context.Context, q querier, t Table, at time.Time) (bool, error) {
	ps, err := list(ctx, q, t)
	if err != nil {
		return false, err
	}
	for _, p := range ps {
		if !p.pending && (p.lower == nil || !p.lower.After(at)) && (p.upper == nil || p.upper.After(at)) {
			return true, nil
		}
	}
	return false, nil
}

func list(ctx context.Context, conn querier, t Table) ([]partition, error) {
	table := t.Name
	rows, err := conn.Query(ctx, listSQL, table, t.ByEffectID)
	if err != nil {
		return nil, fmt.Errorf("partitions: list %s: %w", table, err)
	}
	var ps []partition
	for rows.Next() {
		var p partition
		if err := rows.Scan(&p.name, &p.pending, &p.lower, &p.upper); err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, rows.Err()
}

func (m *Manager) table(ctx context.Context, t Table, rep *Report) error {
	ps, err := list(ctx, m.conn, t)
	if err != nil {
		return err
	}
	now := m.cfg.Now()
	// Interrupted detaches first: a table with a pending detach refuses another detach.
	for _, p := range ps {
		if p.pending {
			dropped, err := m.retire(ctx, t, p, true, rep)
			if err != nil {
				return err
			}
			rep.Finalized = append(rep.Finalized, p.name)
			if dropped {
				rep.Dropped = append(rep.Dropped, p.name)
			} else {
				rep.Kept = append(rep.Kept, p.name)
			}
		}
	}
	rows, err := m.conn.Query(ctx, leftoversSQL, t.Name, likePrefix(t.Name)+"p%", t.Name+"_legacy")
	if err != nil {
		return fmt.Errorf("partitions: leftovers of %s: %w", t.Name, err)
	}
	leftovers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("partitions: leftovers of %s: %w", t.Name, err)
	}
	for _, name := range leftovers {
		if _, ours := nameTime(t.Name, name); !ours && name != t.Name+"_legacy" {
			// Named like a partition but not as the manager names them: someone's table (a backup,
			// oncegate_effects_pre_upgrade), never the manager's to drop.
			continue
		}
		if t.Stray != "" {
			// Detached, and not dropped: the manager was killed between the two, or the question below failed.
			// Asked again whether a row in it came into use, over the ids it holds; if so it goes back, into
			// the gap it left (from the time its name tells to the next partition's lower bound).
			back, err := m.reattachLeftover(ctx, t, name, ps)
			if err != nil {
				return err
			}
			if back {
				rep.Kept = append(rep.Kept, name)
				continue
			}
		}
		if err := m.ddl(ctx, expand(dropSQL, t.Name, name)); err != nil {
			return err
		}
		rep.Dropped = append(rep.Dropped, name)
	}

	horizon := now.Add(-m.retention(t))
	for _, p := range ps {
		if p.pending || p.upper == nil || p.upper.After(horizon) {
			continue
		}
		if t.Keep != "" {
			began := time.Now()
			keep, err := m.ask(ctx, t.Keep, t, p)
			rep.spend("keep", t.Name, began)
			if err != nil {
				return fmt.Errorf("partitions: whether to keep %s: %w", p.name, err)
			}
			if keep {
				rep.Kept = append(rep.Kept, p.name)
				// Its keys may have been freed by an earlier pass (kept after all, or killed) before an
				// effect in it was retried.
				if err := m.restoreKeys(ctx, t, p.name, p.lower, p.upper); err != nil {
					return err
				}
				continue
			}
		}
		if t.FreeKeys != nil {
			began := time.Now()
			freed, held, err := t.FreeKeys(ctx, m.conn, p.name, m.retention(t))
			rep.spend("keys", t.Name, began)
			rep.Freed += freed
			if err != nil {
				return fmt.Errorf("partitions: %w", err)
			}
			if held {
				m.cfg.Logger.Info("partitions: an effect of a partition past retention is in use again (retried), "+
					"or its key has not expired; the partition stays", "partition", p.name)
				rep.Kept = append(rep.Kept, p.name)
				if err := m.restoreKeys(ctx, t, p.name, p.lower, p.upper); err != nil {
					return err
				}
				continue
			}
		}
		// Asked again after the keys: an effect retried and finished while they were being freed (which
		// takes minutes for a day of them) is kept its retention.
		if t.Keep != "" && t.FreeKeys != nil {
			keep, err := m.ask(ctx, t.Keep, t, p)
			if err != nil {
				return fmt.Errorf("partitions: whether to keep %s: %w", p.name, err)
			}
			if keep {
				rep.Kept = append(rep.Kept, p.name)
				if err := m.restoreKeys(ctx, t, p.name, p.lower, p.upper); err != nil {
					return err
				}
				continue
			}
		}
		dropped, err := m.retire(ctx, t, p, false, rep)
		if err != nil {
			return err
		}
		if dropped {
			rep.Dropped = append(rep.Dropped, p.name)
		} else {
			rep.Kept = append(rep.Kept, p.name)
		}
	}
	return nil
}

// reattachLeftover asks t's Stray question of a detached partition, over the ids it holds, and attaches it
// again when a row in it is in use. back: it was attached again.
func (m *Manager) reattachLeftover(ctx context.Context, t Table, name string, ps []partition) (back bool, err error) {
	var lower *time.Time // MINVALUE: the legacy partition
	if name != t.Name+"_legacy" {
		at, ok := nameTime(t.Name, name)
		if !ok {
			return false, nil
		}
		lower = &at
	}
	var upper *time.Time
	for _, p := range ps {
		if p.lower != nil && (lower == nil || p.lower.After(*lower)) && (upper == nil || p.lower.Before(*upper)) {
			upper = p.lower
		}
	}
	if upper == nil {
		return false, nil
	}
	stray, err := m.ask(ctx, t.Stray, t, partition{name: name, lower: lower, upper: upper})
	if err != nil || !stray {
		return false, err
	}
	m.cfg.Logger.Warn("partitions: a detached partition holds a row still in use; attached again", "partition", name)
	if err := m.restoreKeys(ctx, t, name, lower, upper); err != nil {
		return false, err
	}
	q := strings.NewReplacer("{{lower}}", t.bound(lower), "{{upper}}", t.bound(upper)).Replace(attachSQL)
	return true, m.ddl(ctx, expand(q, t.Name, name))
}

// restoreKeys puts back the keys of a partition's rows in use again, once its retirement stopped after its
// keys were freed (or may have been: a leftover of a killed pass).
func (m *Manager) restoreKeys(ctx context.Context, t Table, name string, lower, upper *time.Time) error {
	if t.RestoreKeys == nil {
		return nil
	}
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if lower != nil {
		lo = EffectID(*lower)
	}
	if upper != nil {
		hi = EffectID(*upper)
	}
	n, err := t.RestoreKeys(ctx, m.conn, name, lo, hi)
	if err != nil {
		return fmt.Errorf("partitions: %w", err)
	}
	if n > 0 {
		m.cfg.Logger.Warn("partitions: keys of effects retried while their partition was being retired put back",
			"partition", name, "keys", n)
	}
	return nil
}

// nameTime is the lower bound a partition's name tells (partitionName).
func nameTime(table, name string) (time.Time, bool) {
	suffix, ok := strings.CutPrefix(name, table+"_p")
	// Exactly the layout's 15 characters: time.Parse takes a fraction of a second after the seconds that the
	// layout does not have (…t000000.5), and such a table is someone's, not a partition to drop.
	if !ok || len(suffix) != len("20060102t150405") {
		return time.Time{}, false
	}
	at, err := time.Parse("20060102t150405", suffix)
	return at, err == nil
}

// Ensure creates, without the lock, the partitions of t from its newest one's end (or from the start of the
// present interval, when it has none) until Ahead intervals past now. A gap since the newest partition's
// end is covered by one partition up to the present interval. For test databases copied from a template
// migrated long ago; a gateway's Manager does it under its lock.
func Ensure(ctx context.Context, conn *pgx.Conn, t Table, interval time.Duration, ahead int, now time.Time) ([]string, error) {
	m := &Manager{cfg: Config{Interval: interval, Ahead: ahead, Retries: DefaultRetries}, conn: conn}
	ps, err := list(ctx, conn, t)
	if err != nil {
		return nil, err
	}
	qs, names := m.creates(t, ps, now)
	if len(qs) == 0 {
		return nil, nil
	}
	if err := m.ddl(ctx, strings.Join(qs, "\n")); err != nil {
		return nil, err
	}
	return names, nil
}

// creates returns the statements that create t's partitions from its newest one's end (or from the start of
// the present interval) until Ahead intervals past now, and their names; a gap since the newest partition's
// end is one partition, up to the present interval.
//
// The next partition is made half an interval early, in the middle of an interval, not at its start: a
// partition is retired at the start of an interval (its range, then retention, a whole number of intervals
// in any usual setting), and an ATTACH in the same pass sent its wave of plans made again (every connection,
// every statement that reads the table) into the accepts that were already meeting the retirement's
// freeing of keys. Apart, each wave meets fewer of them (issue 30, `scripts/bench retention`).
func (m *Manager) creates(t Table, ps []partition, now time.Time) (stmts, names []string) {
	iv := m.cfg.Interval
	floor := now.UTC().Truncate(iv)
	until := now.UTC().Add(iv / 2).Truncate(iv).Add(time.Duration(m.cfg.Ahead+1) * iv)
	var from time.Time
	switch {
	case len(ps) == 0:
		from = floor
	case ps[len(ps)-1].upper == nil:
		return nil, nil // reaches MAXVALUE
	default:
		from = ps[len(ps)-1].upper.UTC()
	}
	for from.Before(until) {
		to := from.Truncate(iv).Add(iv)
		if from.Before(floor) {
			to = floor // the gap since the manager last ran, in one partition
		}
		name := partitionName(t.Name, from)
		with := ""
		if t.With != "" {
			with = "WITH (" + t.With + ")"
		}
		q := strings.NewReplacer("{{lower}}", t.literal(&from), "{{upper}}", t.literal(&to), "{{with}}", with).
			Replace(createSQL)
		stmts, names = append(stmts, expand(q, t.Name, name)), append(names, name)
		from = to
	}
	return stmts, names
}

// retire detaches a partition (or finishes its pending detach) and drops it, or, when its table's Stray
// query says a row in it came into use meanwhile, attaches it again; dropped says which.
func (m *Manager) retire(ctx context.Context, t Table, p partition, pending bool, rep *Report) (dropped bool, err error) {
	began := time.Now()
	// A detach whose second transaction timed out waiting for a reader leaves the partition pending, and
	// DETACH ... CONCURRENTLY again is refused ("already pending detach"): its retry is then FINALIZE.
	err = m.ddlEach(ctx, func(again bool) (string, error) {
		if again && !pending {
			var err error
			if pending, err = m.pendingDetach(ctx, p.name); err != nil {
				return "", err
			}
		}
		if pending {
			return expand(finalizeSQL, t.Name, p.name), nil
		}
		return expand(detachSQL, t.Name, p.name), nil
	}, m.cfg.Retries)
	rep.spend("detach", t.Name, began)
	if err != nil {
		// A detach whose wait timed out is pending now: the next pass finishes it.
		return false, err
	}
	if t.Stray != "" {
		stray, err := m.ask(ctx, t.Stray, t, p)
		if err != nil {
			// Detached and not dropped: the next pass's leftovers. Not dropped blind.
			return false, fmt.Errorf("partitions: whether %s is still in use: %w", p.name, err)
		}
		if stray {
			m.cfg.Logger.Warn("partitions: a row came into use while its partition was detached; attached again",
				"partition", p.name)
			if err := m.restoreKeys(ctx, t, p.name, p.lower, p.upper); err != nil {
				return false, err
			}
			q := strings.NewReplacer("{{lower}}", t.bound(p.lower), "{{upper}}", t.bound(p.upper)).
				Replace(attachSQL)
			return false, m.ddl(ctx, expand(q, t.Name, p.name))
		}
	}
	began = time.Now()
	defer rep.spend("drop", t.Name, began)
	return true, m.ddl(ctx, expand(dropSQL, t.Name, p.name))
}

func spentMS(steps []Step) map[string]int64 {
	sum := map[string]time.Duration{}
	for _, st := range steps {
		sum[st.Kind] += st.Took
	}
	out := make(map[string]int64, len(sum))
	for k, d := range sum {
		out[k] = d.Milliseconds()
	}
	return out
}

// pendingDetach reports whether a partition is pending detach (its DETACH ... CONCURRENTLY interrupted).
func (m *Manager) pendingDetach(ctx context.Context, name string) (bool, error) {
	var pending bool
	err := m.conn.QueryRow(ctx, "SELECT coalesce((SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = "+
		"to_regclass($1)), false)", pgx.Identifier{name}.Sanitize()).Scan(&pending)
	if err != nil {
		return false, fmt.Errorf("partitions: whether %s is pending detach: %w", name, err)
	}
	return pending, nil
}

// ask runs one of a table's boolean queries (Keep, Stray) about a partition.
func (m *Manager) ask(ctx context.Context, q string, t Table, p partition) (bool, error) {
	q = strings.NewReplacer("{{lower}}", t.literal(p.lower), "{{upper}}", t.literal(p.upper),
		"{{retention_ms}}", fmt.Sprint(m.retention(t).Milliseconds())).Replace(q)
	var yes bool
	err := m.conn.QueryRow(ctx, expand(q, t.Name, p.name)).Scan(&yes)
	return yes, err
}

// ddl runs a statement, again with backoff while it cannot have its lock within lock_timeout.
func (m *Manager) ddl(ctx context.Context, q string) error { return m.ddlTries(ctx, q, m.cfg.Retries) }

// ddlTries is ddl with retries tries again at most.
func (m *Manager) ddlTries(ctx context.Context, q string, retries int) error {
	return m.ddlEach(ctx, func(bool) (string, error) { return q, nil }, retries)
}

// ddlEach is ddlTries with the statement asked for at each try (again: not the first).
func (m *Manager) ddlEach(ctx context.Context, stmt func(again bool) (string, error), retries int) error {
	delay := 20 * time.Millisecond
	for i := 0; ; i++ {
		q, err := stmt(i > 0)
		if err != nil {
			return err
		}
		_, err = m.conn.Exec(ctx, q)
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || (pe.Code != "55P03" && pe.Code != "40P01") || i >= retries {
			if err != nil {
				return fmt.Errorf("partitions: %s: %w", firstLine(q), err)
			}
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 2*time.Second)
	}
}

func expand(q, parent, part string) string {
	return strings.NewReplacer("{{parent}}", pgx.Identifier{parent}.Sanitize(),
		"{{partition}}", pgx.Identifier{part}.Sanitize()).Replace(q)
}

func literal(t time.Time) string { return "'" + t.UTC().Format(time.RFC3339Nano) + "'" }

// literal is a bound of the table's partition key, for a query; nil (MINVALUE's) is the lowest value there is.
// A retired partition's upper bound is never nil (MAXVALUE): it is past.
func (t Table) literal(at *time.Time) string {
	switch {
	case at != nil && t.ByEffectID:
		return fmt.Sprint(EffectID(*at))
	case at != nil:
		return literal(*at)
	case t.ByEffectID:
		return fmt.Sprint(int64(math.MinInt64))
	}
	return "'-infinity'"
}

// bound is a bound of the table's partition key, for FOR VALUES; nil is MINVALUE.
func (t Table) bound(at *time.Time) string {
	if at == nil {
		return "MINVALUE"
	}
	return t.literal(at)
}

func partitionName(table string, lower time.Time) string {
	return table + "_p" + lower.UTC().Format("20060102t150405")
}

// likePrefix is the LIKE pattern's prefix of a table's partitions' names: table_ (escaped).
func likePrefix(table string) string {
	return strings.NewReplacer(`\`, `\\`, "_", `\_`, "%", `\%`).Replace(table) + `\_`
}

func firstLine(q string) string {
	for _, l := range strings.Split(q, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
			return l
		}
	}
	return q
}
