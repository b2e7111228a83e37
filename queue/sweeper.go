package queue

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The sweeper takes back the jobs of workers that are gone (their liveness connection closed) or whose leases
// ran out. Every worker runs it over its liveness connection; a guard key lets it run once per interval across
// all of them.

func (w *Worker) sweepOnce(ctx context.Context, l *liveness) {
	res, err := w.q.sweep(ctx, l.client(), w.sweepSettings(), l)
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
