package pgtest

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// Writes counts what a client writes to Postgres once armed: how many round trips a step starts, which is
// what a crash-window test asserts (a statement in one write, no ping before it).
type Writes struct {
	armed atomic.Bool
	n     atomic.Int32
}

// CountWrites has every connection that cfg dials count its writes in the returned Writes.
func CountWrites(cfg *pgconn.Config) *Writes {
	w := &Writes{}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, w: w}, nil
	}
	return w
}

// Arm starts the count from zero.
func (w *Writes) Arm() { w.n.Store(0); w.armed.Store(true) }

// Disarm stops the count.
func (w *Writes) Disarm() { w.armed.Store(false) }

// Count is the writes since Arm.
func (w *Writes) Count() int { return int(w.n.Load()) }

type countingConn struct {
	net.Conn
	w *Writes
}

func (c countingConn) Write(b []byte) (int, error) {
	if c.w.armed.Load() {
		c.w.n.Add(1)
	}
	return c.Conn.Write(b)
}
