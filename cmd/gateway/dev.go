package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncegate/oncegate/gateway"
)

// keygen prints a new API key (32 random bytes, base64url, behind "og_") and, on the next line, its sha256:
// form, which a configuration may hold instead of the key.
// keygenCmd is `gateway keygen [--webhook]`.
func keygenCmd(args []string, w io.Writer) error {
	switch {
	case len(args) == 0:
		return keygen(w)
	case len(args) == 1 && (args[0] == "--webhook" || args[0] == "-webhook"):
		return webhookSecret(w)
	}
	return errUsage
}

// webhookSecret prints a new webhook signing secret as Standard Webhooks writes one: whsec_ and the base64 of
// 32 random bytes (a webhook type refuses fewer than 24).
func webhookSecret(w io.Writer) error {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "whsec_"+base64.StdEncoding.EncodeToString(b))
	return err
}

func keygen(w io.Writer) error {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	key := "og_" + base64.RawURLEncoding.EncodeToString(b)
	_, err := fmt.Fprintf(w, "%s\n%s\n", key, gateway.HashKey(key))
	return err
}

// Postgres's SQLSTATEs for a database that does not exist and for one created meanwhile.
const (
	invalidCatalogName = "3D000"
	duplicateDatabase  = "42P04"
)

func missingDatabase(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == invalidCatalogName
}

// createDatabase creates the database that databaseURL names if the server answers that it has no such
// database, from the server's "postgres" maintenance database. It is for `serve --dev`: a first run on a
// laptop should just work. Any other failure to connect is left for the migrations to report.
func createDatabase(ctx context.Context, databaseURL string, log *slog.Logger) error {
	pc, err := pgxpool.ParseConfig(databaseURL) // strips the pool's own parameters, which the server refuses
	if err != nil {
		return fmt.Errorf("database_url: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err == nil {
		return conn.Close(ctx)
	}
	if !missingDatabase(err) {
		return nil
	}
	name := pc.ConnConfig.Database
	admin := pc.ConnConfig.Copy()
	admin.Database = "postgres"
	conn, err = pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("database %q does not exist, and the postgres database to create it from cannot be "+
			"reached: %w", name, err)
	}
	defer conn.Close(ctx)
	// A database name cannot be a query parameter: it is quoted as an identifier instead.
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == duplicateDatabase {
		return nil // another process created it first
	}
	if err != nil {
		return fmt.Errorf("database %q does not exist, and creating it failed: %w", name, err)
	}
	log.Info("created the database (serve --dev)", "database", name)
	return nil
}

// explainMissingDatabase adds to a "database does not exist" error the one command that fixes it.
func explainMissingDatabase(err error, databaseURL string) error {
	if !missingDatabase(err) {
		return err
	}
	cc, perr := pgxpool.ParseConfig(databaseURL)
	if perr != nil {
		return err
	}
	c := cc.ConnConfig
	return fmt.Errorf("%w: create it with `createdb -h %s -p %d -U %s %s`, or run `gateway serve --dev`, which "+
		"creates it", err, c.Host, c.Port, c.User, c.Database)
}
