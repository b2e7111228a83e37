package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/testkit/pgtest"
)

// Chaos sizes its gateways' pools to the server's room, and says what to do when there is none, instead of
// failing with "sorry, too many clients already".
func TestChaosFitsItsGatewaysToPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.StartCluster(t)
	per, hint, err := connectionBudget(ctx, c.URL(), 2)
	if err != nil || per < 4 || per > maxGatewayPool || hint != "" {
		t.Fatalf("a default server: %d conns a gateway, %q, %v", per, hint, err)
	}
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET max_connections = 15"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	c.Stop()
	c.Start()
	if per, hint, err := connectionBudget(ctx, c.URL(), 2); err != nil || per != 4 || !strings.Contains(hint, "raise max_connections") {
		t.Fatalf("a server with room for 12: %d %q %v", per, hint, err)
	}
	u, err := withPool("postgres://u@h:5432/db?sslmode=disable", 9)
	if err != nil || u != "postgres://u@h:5432/db?pool_max_conns=9&sslmode=disable" {
		t.Fatalf("withPool: %s %v", u, err)
	}
}
