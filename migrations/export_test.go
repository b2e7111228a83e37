package migrations

import (
	"context"
	"database/sql"
)

// UpTo applies the migrations up to version, for tests that need rows as an older schema wrote them.
func UpTo(ctx context.Context, db *sql.DB, version int64) error {
	p, err := provider(db, nil, DefaultLockWait)
	if err != nil {
		return err
	}
	_, err = p.UpTo(ctx, version)
	return err
}

// Source returns a migration file's text.
func Source(name string) string {
	b, err := files.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}
