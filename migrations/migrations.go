// Package migrations holds the gateway's database schema as numbered SQL files, embedded in the binary, and
// applies them. Migrations only go forward. Each runs in a transaction together with the record of its
// version, and a lock serialises gateways that start at once, so a crash or a race leaves the schema at one
// version or the next, never between.
//
// The lock is a row in a table (LockTable), leased and kept alive by a heartbeat, not a session advisory lock:
// behind PgBouncer in transaction pooling mode consecutive statements run on different server connections,
// so a session lock is taken on one, released (or not) on another, and held for good by a pooled connection.
// A gateway killed while migrating leaves a lease that runs out (30 s); one that cannot take the lock within
// its bound gives up with an error instead of waiting for ever.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// versionTable records applied migrations.
const versionTable = "oncegate_schema_migrations"

const (
	// LockTable holds the migration lock: a row naming the gateway that migrates and until when its lease runs.
	LockTable = "oncegate_migration_lock"
	// LockID is the lock's row in LockTable.
	LockID = lock.DefaultLockID
	// DefaultLockWait is how long Up waits for another gateway's migration lock before it gives up.
	DefaultLockWait = 5 * time.Minute
)

// lockRetry is how often a start that waits for the migration lock tries to take it.
const lockRetry = time.Second

func provider(db *sql.DB, log *slog.Logger, lockWait time.Duration) (*goose.Provider, error) {
	lopts := []lock.TableLockerOption{lock.WithTableName(LockTable), lock.WithTableLockID(LockID),
		lock.WithTableLockTimeout(lockRetry, uint64(max(1, lockWait/lockRetry)))}
	if log != nil {
		lopts = append(lopts, lock.WithTableLogger(log))
	}
	locker, err := lock.NewPostgresTableLocker(lopts...)
	if err != nil {
		return nil, err
	}
	opts := []goose.ProviderOption{goose.WithLocker(boundedLocker{Locker: locker, wait: lockWait}),
		goose.WithDisableGlobalRegistry(true), goose.WithTableName(versionTable)}
	if log != nil {
		opts = append(opts, goose.WithSlog(log))
	}
	return goose.NewProvider(goose.DialectPostgres, db, files, opts...)
}

// boundedLocker says, when the lock is not had within its bound, which lock and how long it waited.
type boundedLocker struct {
	lock.Locker
	wait time.Duration
}

func (l boundedLocker) Lock(ctx context.Context, db *sql.DB) error {
	if err := l.Locker.Lock(ctx, db); err != nil {
		return fmt.Errorf("could not take the migration lock (a row of table %s, held by the gateway that "+
			"migrates) within %v: %w", LockTable, l.wait, err)
	}
	return nil
}

// Up applies every pending migration and returns the schema version reached, waiting up to DefaultLockWait
// for a gateway that migrates meanwhile.
func Up(ctx context.Context, db *sql.DB, log *slog.Logger) (int64, error) {
	return UpWithin(ctx, db, log, DefaultLockWait)
}

// UpWithin is Up waiting up to lockWait for the migration lock. A database with nothing pending is not locked.
func UpWithin(ctx context.Context, db *sql.DB, log *slog.Logger, lockWait time.Duration) (int64, error) {
	p, err := provider(db, log, lockWait)
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	// goose's Up and GetDBVersion take the lock even with nothing to do: a start would then wait for any
	// other start's migration, or for a killed holder's lease to run out. GetVersions reads without it.
	current, target, err := p.GetVersions(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrations: read version: %w", err)
	}
	if current >= target {
		return current, nil
	}
	if log != nil {
		log.Info("migrating the database schema: taking the migration lock", "from", current, "to", target,
			"lock_table", LockTable, "wait_at_most", lockWait.String())
	}
	if _, err := p.Up(ctx); err != nil {
		return 0, fmt.Errorf("migrations: apply: %w", err)
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrations: read version: %w", err)
	}
	return v, nil
}

// Pending reports whether the database lacks migrations that this binary has.
func Pending(ctx context.Context, db *sql.DB) (bool, error) {
	p, err := provider(db, nil, DefaultLockWait)
	if err != nil {
		return false, fmt.Errorf("migrations: %w", err)
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: check: %w", err)
	}
	return pending, nil
}

// Files returns the embedded migration files. Tests key a migrated template database by their content, so a
// changed migration gets a template of its own.
func Files() fs.FS { return files }
