// Package migrations holds the gateway's database schema as numbered SQL files, embedded in the binary, and
// applies them. Migrations only go forward. Each runs in a transaction together with the record of its
// version, and a Postgres advisory lock serialises gateways that start at once, so a crash or a race leaves
// the schema at one version or the next, never between.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// versionTable records applied migrations.
const versionTable = "oncegate_schema_migrations"

func provider(db *sql.DB, log *slog.Logger) (*goose.Provider, error) {
	// Gateways that start together wait for the one migrating: retry the lock every second, for 5 minutes.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, err
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(versionTable)}
	if log != nil {
		opts = append(opts, goose.WithSlog(log))
	}
	return goose.NewProvider(goose.DialectPostgres, db, files, opts...)
}

// Up applies every pending migration and returns the schema version reached.
func Up(ctx context.Context, db *sql.DB, log *slog.Logger) (int64, error) {
	p, err := provider(db, log)
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
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
	p, err := provider(db, nil)
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
