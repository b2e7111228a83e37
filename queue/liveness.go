package queue

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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
	rdb *redis.Client // one connection, to the node that holds the queue's hash slot
	log *slog.Logger
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
		o := *c.Options()
		return &o, nil
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("queue: find the cluster node of %s: %w", key, err)
		}
		o := *node.Options()
		return &o, nil
	default:
		return nil, fmt.Errorf("queue: a worker needs a *redis.Client or *redis.ClusterClient, not %T", rdb)
	}
}

// ownJobClient returns a client of the worker's own for job traffic, shaped like the caller's.
func ownJobClient(rdb redis.UniversalClient, poolSize int, readTimeout time.Duration) (redis.UniversalClient, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		o := *c.Options()
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = poolSize, 0, poolSize, 0
		o.ReadTimeout = atLeast(o.ReadTimeout, readTimeout)
		o.PoolTimeout = 0
		o.MaxRetries = -1 // a lease or completion repeated after a lost answer would run twice: the loops retry
		return redis.NewClient(&o), nil
	case *redis.ClusterClient:
		o := *c.Options()
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = poolSize, 0, poolSize, 0
		o.ReadTimeout = atLeast(o.ReadTimeout, readTimeout)
		o.PoolTimeout = 0
		o.MaxRetries = -1
		return redis.NewClusterClient(&o), nil
	default:
		return nil, fmt.Errorf("queue: a worker needs a *redis.Client or *redis.ClusterClient, not %T", rdb)
	}
}

// atLeast raises a timeout to min, leaving go-redis's special negative values (no deadline) alone.
func atLeast(d, min time.Duration) time.Duration {
	if d < 0 {
		return d
	}
	return max(d, min)
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

// seenFor is how long a heartbeat makes the worker count as alive in Stats.
func (w *Worker) seenFor() time.Duration { return 3 * w.cfg.HeartbeatInterval }

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
	old := l.rdb
	l.rdb = next
	_ = old.Close()
	w.log.Info("liveness connection follows the queue's slot to another node", "addr", next.Options().Addr)
}

// heartbeat marks the worker seen, extends the leases of its runs, cancels each run whose lease is gone, and
// hands back leases it was given but never heard of.
func (w *Worker) heartbeat(ctx context.Context, l *liveness) error {
	pairs, orphansBefore := w.heartbeatState()
	args := append([]any{w.id, w.seenFor().Milliseconds(), w.leaseFor().Milliseconds(), orphansBefore}, pairs...)
	k := w.q.keys
	res, err := heartbeatScript.Run(ctx, l.rdb, []string{k.jobs, k.leases, k.workers, k.owned, k.ready, k.marker},
		args...).StringSlice()
	if err != nil {
		return fmt.Errorf("queue: heartbeat: %w", err)
	}
	if res[0] != "0" {
		w.log.Warn("handed back jobs leased to this worker whose lease never reached it", "jobs", res[0])
	}
	for i := 1; i+1 < len(res); i += 2 {
		epoch, err := strconv.ParseInt(res[i+1], 10, 64)
		if err != nil {
			return fmt.Errorf("queue: heartbeat: bad epoch %q", res[i+1])
		}
		w.lose(runKey{id: res[i], epoch: epoch})
	}
	return nil
}

// leaseFor is the lease a lease or heartbeat sets: LeaseTTL counted from the next heartbeat due, so that a
// pause shorter than LeaseTTL never costs a live worker its job, wherever it falls between two beats.
func (w *Worker) leaseFor() time.Duration { return w.cfg.LeaseTTL + w.cfg.HeartbeatInterval }

// jobReadTimeout bounds a command of the worker's job traffic, the blocking wait for jobs included.
func (w *Worker) jobReadTimeout() time.Duration { return w.cfg.IdleBlock + 5*time.Second }

func (w *Worker) sweepOnce(ctx context.Context, l *liveness) {
	res, err := w.q.sweep(ctx, l.rdb, w.sweepSettings(), l)
	if ctx.Err() != nil {
		return
	}
	w.noteLiveness(ctx, l, "sweep", err)
	switch {
	case err != nil, !res.Ran:
		return
	case res.Outage > 0:
		w.log.Warn("no sweep ran for a while (Redis stalled, or every sweeping worker paused): lease expiry held "+
			"so that live workers can heartbeat first", "gap", res.Outage, "hold", w.sweepSettings().outageGrace)
	}
	if res.Reclaimed > 0 || res.Dead > 0 || res.WorkersLost > 0 {
		w.log.Info("sweep reclaimed stalled jobs", "reclaimed", res.Reclaimed, "dead", res.Dead,
			"workers_lost", res.WorkersLost)
	}
	if w.cfg.OnSweep != nil {
		w.cfg.OnSweep(res)
	}
}

// sweepSettings are the numbers a sweep run by this worker applies to every worker of the queue, which is
// why a queue's workers should share their liveness settings.
type sweepSettings struct {
	guard          time.Duration // a little under the sweep interval, so the worker that took it can again
	reconnectGrace time.Duration
	restartGrace   time.Duration
	outageAfter    time.Duration // a gap between sweeps longer than this is an outage
	outageGrace    time.Duration // how long lease expiry is held after one
	limit          int
}

func (w *Worker) sweepSettings() sweepSettings {
	return sweepSettings{
		guard:          max(w.cfg.SweepInterval*9/10, time.Millisecond),
		reconnectGrace: w.cfg.ReconnectGrace,
		restartGrace:   max(4*w.cfg.ReconnectGrace, 2*w.cfg.HeartbeatInterval),
		outageAfter:    max(w.cfg.HeartbeatInterval, 5*w.cfg.SweepInterval),
		outageGrace:    2 * w.cfg.HeartbeatInterval,
		limit:          1000,
	}
}

// SweepResult says what one sweep did. Ran is false when another sweep ran within the interval.
type SweepResult struct {
	Ran                          bool
	Reclaimed, Dead, WorkersLost int
	// Outage is the gap since the previous sweep when it was long enough to hold lease expiry back.
	Outage time.Duration
}

// sweep runs the sweeper once over c, a client of the node that holds the queue, unless another sweep ran
// within the interval. With l nil or its checks off, dead workers are found by their leases alone.
func (q *Queue) sweep(ctx context.Context, c *redis.Client, s sweepSettings, l *liveness) (SweepResult, error) {
	k := q.keys
	regs, err := sweepBeginScript.Run(ctx, c, []string{k.sweepGuard, k.sweeper, k.conns},
		s.guard.Milliseconds()).StringSlice()
	if errors.Is(err, redis.Nil) {
		return SweepResult{}, nil
	}
	if err != nil {
		return SweepResult{}, fmt.Errorf("queue: sweep: %w", err)
	}
	args := []any{s.reconnectGrace.Milliseconds(), s.restartGrace.Milliseconds(), s.outageAfter.Milliseconds(),
		s.outageGrace.Milliseconds(), s.limit}
	if l == nil || l.connCheck.Load() {
		gone, err := goneConnections(ctx, c, regs[0], regs[1:])
		switch {
		case err != nil && refused(err) && l != nil:
			l.disable(err)
		case err != nil:
			return SweepResult{}, fmt.Errorf("queue: sweep: %w", err)
		}
		args = append(args, gone...)
	}
	out := SweepResult{Ran: true}
	// A script call reclaims a bounded number of jobs, so that Redis is never blocked long; a dead worker that
	// held thousands is emptied by calls in a row, not one per interval.
	for range 100 {
		res, err := sweepScript.Run(ctx, c, []string{k.jobs, k.owned, k.leases, k.ready, k.dead, k.marker,
			k.workers, k.conns, k.missing, k.sweeper}, args...).Int64Slice()
		if err != nil {
			return out, fmt.Errorf("queue: sweep: %w", err)
		}
		out.Reclaimed += int(res[0])
		out.Dead += int(res[1])
		out.WorkersLost += int(res[2])
		out.Outage = max(out.Outage, time.Duration(res[3])*time.Millisecond)
		if res[4] == 0 {
			break
		}
	}
	return out, nil
}

// goneConnections returns the (worker id, registration) pairs of regs whose connection no longer exists on the
// server whose run id is runID, and those registered on another server run. A registration is
// "<run id>:<client id>:<reconnect grace ms>".
func goneConnections(ctx context.Context, c *redis.Client, runID string, regs []string) ([]any, error) {
	var gone []any
	byClient := map[string][]string{} // client id -> worker id, registration
	args := []any{"CLIENT", "LIST", "ID"}
	for i := 0; i+1 < len(regs); i += 2 {
		parts := strings.Split(regs[i+1], ":")
		if len(parts) != 3 || parts[0] != runID {
			gone = append(gone, regs[i], regs[i+1])
			continue
		}
		byClient[parts[1]] = []string{regs[i], regs[i+1]}
		args = append(args, parts[1])
	}
	if len(byClient) == 0 {
		return gone, nil
	}
	list, err := c.Do(ctx, args...).Text()
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(strings.NewReader(list))
	for sc.Scan() {
		if f, _, _ := strings.Cut(sc.Text(), " "); strings.HasPrefix(f, "id=") {
			delete(byClient, f[len("id="):])
		}
	}
	for _, wr := range byClient {
		gone = append(gone, wr[0], wr[1])
	}
	return gone, nil
}
