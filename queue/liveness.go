package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// A worker tells "dead" from "slow" by its connections. A process that exits, however it exits, has its
// sockets closed by the kernel, and Redis drops the connection at once; a process that is frozen, paused or
// busy keeps it. So each worker process keeps one connection of its own to the Redis node that holds its
// queue (its liveness connection: never from the caller's pool, which handlers may exhaust), registers that
// connection's CLIENT ID, and sends its heartbeats and sweeps over it. The sweeper asks Redis which registered
// connections still exist (CLIENT LIST ID): a worker whose connection is gone, and that has not registered a
// new one within ReconnectGrace, is gone, and its jobs go back to ready. A worker that is alive but frozen or
// cut off keeps its connection and is left to its per-job leases.
//
// Job traffic (lease, complete, fail) goes over a small pool of the worker's own too, for the same reason.

// liveness is a worker's liveness connection and what the worker knows about it.
type liveness struct {
	// mu guards rdb and closed: the liveness loop replaces rdb when the queue's slot moves, while Run closes
	// it from outside the loop to break a heartbeat stuck on an unreachable Redis.
	mu     sync.Mutex
	rdb    *redis.Client // one connection, to the node that holds the queue's hash slot
	closed bool
	log    *slog.Logger
	// connCheck is false once Redis has refused CLIENT ID or CLIENT LIST: crash detection then rests on leases.
	connCheck atomic.Bool
	warnOnce  sync.Once
	// failures counts liveness commands failed in a row, so that a long outage logs now and then, not 10 times
	// a second.
	failures int
}

// nodeOptions returns the options of a client for the Redis node that serves key: the caller's own for a
// single server (or a Sentinel-managed one, whose dialer follows the master), the master of key's slot for a
// cluster.
func nodeOptions(ctx context.Context, rdb redis.UniversalClient, key string) (*redis.Options, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		return copyOptions(c), nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("queue: find the cluster node of %s: %w", key, err)
		}
		return copyOptions(node), nil
	default:
		return nil, fmt.Errorf("queue: a worker needs a *redis.Client or *redis.ClusterClient, not %T", rdb)
	}
}

// copyOptions returns a copy of c's options for a client of the worker's own. go-redis stores each client's
// push-notification processor in its options, so a plain copy would share c's: the new client would register
// its handlers on it a second time and both clients' connections would run them at once.
//
// The maintenance-notification settings are the worker's own too: go-redis rewrites c's (under a lock of its
// own) when a connection's handshake turns them off, and a new client reads what it copies, so a worker that
// redialled its liveness connection while a cluster node's client connected raced with it (caught by -race in
// TestWorkersFollowAClusterFailover). Off: the worker's clients ride out a node's maintenance as any lost
// connection, by dialling again.
func copyOptions(c *redis.Client) *redis.Options {
	o := *c.Options()
	o.PushNotificationProcessor = nil
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return &o
}

// dialLiveness opens the worker's liveness connection. Each time go-redis connects it (at start, and again
// after a network blip, a Redis restart or a failover), the connection registers its CLIENT ID before any
// command runs on it.
func (w *Worker) dialLiveness(ctx context.Context, l *liveness) (*redis.Client, error) {
	o, err := nodeOptions(ctx, w.q.rdb, w.q.keys.jobs)
	if err != nil {
		return nil, err
	}
	userOnConnect := o.OnConnect
	k := w.q.keys
	seen := w.seenFor().Milliseconds()
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if userOnConnect != nil {
			if err := userOnConnect(ctx, cn); err != nil {
				return err
			}
		}
		// The name is for operators reading CLIENT LIST; Redis may refuse it, and nothing depends on it.
		_ = cn.ClientSetName(ctx, "oncegate-worker-"+w.id).Err()
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			if refused(err) {
				l.disable(fmt.Errorf("CLIENT ID: %w", err))
				return nil
			}
			return err
		}
		err = registerScript.Run(ctx, cn, []string{k.conns, k.missing, k.workers}, w.id, id, seen,
			w.cfg.ReconnectGrace.Milliseconds()).Err()
		if err != nil && !errors.Is(err, redis.Nil) { // Nil: a newer connection of ours is registered already
			return fmt.Errorf("queue: register liveness connection: %w", err)
		}
		return nil
	}
	// One connection, never reaped for idleness. Its timeouts ride
	// out a Redis stall of several seconds: dropping the connection then would look like a death.
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 1, 0
	o.ConnMaxIdleTime, o.ConnMaxLifetime = -1, 0
	// A command retried on a fresh connection is one the sweepers need not wait for: the new connection
	// registers before it runs. Every liveness script is safe to run twice.
	o.MaxRetries = 1
	o.ReadTimeout = atLeast(o.ReadTimeout, max(10*time.Second, w.cfg.LeaseTTL/3))
	o.WriteTimeout = o.ReadTimeout
	o.PoolTimeout = 0
	return redis.NewClient(o), nil
}

// checkClientList makes sure at start that Redis answers CLIENT LIST ID, on which crash detection rests, so
// that a worker whose Redis forbids it says so at once rather than at its first sweep.
func (w *Worker) checkClientList(ctx context.Context, l *liveness) {
	err := l.client().Do(ctx, "CLIENT", "LIST", "ID", "0").Err()
	if err != nil && refused(err) {
		l.disable(fmt.Errorf("CLIENT LIST ID: %w", err))
	}
}

// client returns the liveness connection's client.
func (l *liveness) client() *redis.Client {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rdb
}

// replace puts next in place of the current client and closes the old one; once the liveness connection is
// closed it closes next instead and reports false.
func (l *liveness) replace(next *redis.Client) bool {
	l.mu.Lock()
	old, closed := l.rdb, l.closed
	if !closed {
		l.rdb = next
	}
	l.mu.Unlock()
	if closed {
		_ = next.Close()
		return false
	}
	_ = old.Close()
	return true
}

// close closes the liveness connection for good: a command waiting on it returns, and a redial that races
// with it closes what it dialled.
func (l *liveness) close() {
	l.mu.Lock()
	rdb := l.rdb
	l.closed = true
	l.mu.Unlock()
	_ = rdb.Close()
}

// disable turns connection checks off for this worker, saying so once.
func (l *liveness) disable(err error) {
	l.connCheck.Store(false)
	l.warnOnce.Do(func() {
		l.log.Warn("Redis refuses the commands that tell a dead worker from a slow one; a crashed worker's jobs "+
			"are found by their per-job lease (LeaseTTL) only", "err", err)
	})
}

// isServerError reports whether err is Redis's answer (an ACL refusal, an unknown command) rather than a
// network failure: asking again will not help.
func isServerError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, redis.Nil)
}

// refused reports whether Redis refused a command as such (an ACL, an unknown command), not because the
// queue's slot moved to another node.
func refused(err error) bool { return isServerError(err) && !isMoved(err) }

// isMoved reports whether Redis answered that the queue's slot lives elsewhere now (a failover, a resharding).
func isMoved(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	for _, p := range []string{"MOVED ", "ASK ", "READONLY ", "CLUSTERDOWN "} {
		if strings.HasPrefix(rerr.Error(), p) {
			return true
		}
	}
	return false
}

// livenessLoop sends heartbeats every HeartbeatInterval and runs the sweeper every SweepInterval, both over
// the liveness connection, until ctx ends. A failed heartbeat is retried soon rather than a whole interval
// later.
func (w *Worker) livenessLoop(ctx context.Context, l *liveness) {
	now := time.Now()
	nextBeat := now.Add(w.cfg.HeartbeatInterval)
	// A random first sweep keeps workers started together from reaching for the guard in step.
	nextSweep := now.Add(jitter(w.cfg.SweepInterval))
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now = time.Now()
		if !now.Before(nextBeat) {
			err := w.heartbeat(ctx, l)
			if ctx.Err() != nil {
				return
			}
			w.noteLiveness(ctx, l, "heartbeat", err)
			nextBeat = now.Add(w.cfg.HeartbeatInterval)
			if err != nil {
				nextBeat = time.Now().Add(min(w.cfg.HeartbeatInterval, w.cfg.SweepInterval))
			}
		}
		if !now.Before(nextSweep) {
			w.sweepOnce(ctx, l)
			nextSweep = now.Add(w.cfg.SweepInterval)
		}
		t.Reset(time.Until(earliest(nextBeat, nextSweep)))
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// noteLiveness keeps track of the liveness connection after each command on it: it follows a cluster's slot
// to its new master, and says what fails in the log now and then.
func (w *Worker) noteLiveness(ctx context.Context, l *liveness, what string, err error) {
	if err == nil {
		if l.failures > 0 {
			w.log.Info("liveness connection works again", "failed", l.failures)
		}
		l.failures = 0
		return
	}
	l.failures++
	if l.failures == 1 || l.failures%50 == 0 {
		w.log.Warn(what+" failed; retrying", "err", err, "failed_in_a_row", l.failures)
	}
	if isMoved(err) {
		w.redial(ctx, l)
	}
}

// redial replaces the liveness connection with one to the node that holds the queue's slot now.
func (w *Worker) redial(ctx context.Context, l *liveness) {
	if c, ok := w.q.rdb.(*redis.ClusterClient); ok {
		c.ReloadState(ctx)
	}
	next, err := w.dialLiveness(ctx, l)
	if err != nil {
		w.log.Warn("could not find the queue's Redis node again", "err", err)
		return
	}
	if !l.replace(next) {
		return
	}
	w.log.Info("liveness connection follows the queue's slot to another node", "addr", next.Options().Addr)
}
