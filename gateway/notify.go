package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncegate/oncegate/internal/backoff"
)

// listenIdle is how long the listener waits for a notification before it checks its connection.
const listenIdle = 15 * time.Second

// listener holds one connection that LISTENs for the gateways' notifications: new outbox rows (wake the
// dispatcher) and effects that became terminal (wake requests waiting on them). After a reconnect, everyone is
// woken, since notifications sent meanwhile are lost.
type listener struct {
	url      string
	log      *slog.Logger
	onOutbox func()
	waiters  *waiters
}

func (l *listener) run(ctx context.Context) {
	var failures int
	for ctx.Err() == nil {
		err := l.listen(ctx, func() { failures = 0 })
		if ctx.Err() != nil {
			return
		}
		failures++
		d := backoff.Policy{Base: 200 * time.Millisecond, Max: 5 * time.Second}.Delay(failures)
		l.log.Warn("notification listener lost its connection; reconnecting", "err", err, "in", d.String())
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
}

func (l *listener) listen(ctx context.Context, connected func()) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.Connect(cctx, l.url)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, ch := range []string{"oncegate_outbox", "oncegate_effect_done"} {
		if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
			return err
		}
	}
	connected()
	l.onOutbox()
	l.waiters.wakeAll()
	for {
		// Wait in slices and ping when idle: a connection that a network fault left dead without an error
		// (a blackhole) is found and replaced within a slice, not after the OS's keepalive gives up.
		wctx, cancel := context.WithTimeout(ctx, listenIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("idle connection failed its ping: %w", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		switch n.Channel {
		case "oncegate_outbox":
			l.onOutbox()
		case "oncegate_effect_done":
			for _, f := range strings.Split(n.Payload, ",") {
				if id, err := strconv.ParseInt(f, 10, 64); err == nil {
					l.waiters.wake(id)
				}
			}
		}
	}
}

// waiters are requests waiting for effects to become terminal.
type waiters struct {
	mu sync.Mutex
	m  map[int64][]chan struct{}
}

func newWaiters() *waiters { return &waiters{m: map[int64][]chan struct{}{}} }

// add returns a channel closed when effect id may have changed, and a function that forgets it.
func (w *waiters) add(id int64) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	w.mu.Lock()
	w.m[id] = append(w.m[id], ch)
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		list := w.m[id]
		for i, c := range list {
			if c == ch {
				w.m[id] = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(w.m[id]) == 0 {
			delete(w.m, id)
		}
	}
}

func (w *waiters) wake(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[id] {
		close(ch)
	}
	delete(w.m, id)
}

func (w *waiters) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, list := range w.m {
		for _, ch := range list {
			close(ch)
		}
		delete(w.m, id)
	}
}
