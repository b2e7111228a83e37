package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// maxGatewayPool is the gateway's own default pool size (gateway.DefaultMaxConns): chaos never asks for more.
const maxGatewayPool = 40

// connectionBudget sizes each chaos gateway's pool to what the Postgres at adminURL has room for. A default
// Postgres allows 100 connections; two gateways at 40 each, plus a killed gateway's connections that are
// still open when its restart connects, overflowed it, and chaos failed with Postgres's "sorry, too many
// clients already" and no hint (an outside tester's finding). Each gateway is counted twice (itself, and the
// restart that may overlap a killed one), with its LISTEN connection, and a few are left for everything else.
// Pools open lazily, so a tight budget may still do: hint then says what to change if chaos fails for want
// of connections, rather than failing before trying.
func connectionBudget(ctx context.Context, adminURL string, gateways int) (per int, hint string, err error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return 0, "", fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.Background())
	var allowed, used int
	err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int -
		current_setting('superuser_reserved_connections')::int, (SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend')::int`).Scan(&allowed, &used)
	if err != nil {
		return 0, "", fmt.Errorf("read postgres's connection limit: %w", err)
	}
	const spare, minPool = 6, 4
	per = min(maxGatewayPool, (allowed-used-spare)/(2*gateways)-1)
	if per < minPool {
		need := used + spare + 2*gateways*(minPool+1)
		hint = fmt.Sprintf("postgres allows %d client connections and %d are in use: chaos with %d gateways "+
			"needs about %d; if it fails with \"too many clients\", raise max_connections (ALTER SYSTEM SET "+
			"max_connections = %d, then restart postgres) or stop what holds the others",
			allowed, used, gateways, need, max(need, 100))
		per = minPool
	}
	return per, hint, nil
}

// withPool sets the pool size of a gateway's database URL.
func withPool(dbURL string, conns int) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(conns))
	u.RawQuery = q.Encode()
	return u.String(), nil
}
