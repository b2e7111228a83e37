package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncegate/oncegate/internal/backoff"
)

// The completer records what came of each run: completions are group-committed, failures are recorded one
// by one, and a closing worker hands back the jobs still running. Each write is fenced by the run's epoch in
// Redis, so a run whose lease was taken away changes nothing.

type completion struct {
	id    string
	epoch int64
	done  chan error
}

// recordRetry is the backoff between attempts at recording an outcome while Redis is unreachable.
var recordRetry = backoff.Policy{Base: 100 * time.Millisecond, Max: 2 * time.Second}

// complete hands the completion to the batcher and, while Redis cannot record it, tries again with backoff
// until it is recorded, the lease is found lost, or the worker's drain time is up. The run keeps its lease
// meanwhile (it stays among the runs the heartbeat extends), so a job whose handler succeeded is not handed
// back and run again because Redis was restarting, loading its data or failing over when it finished.
func (w *Worker) complete(job *Job) error {
	for attempt := 1; ; attempt++ {
		c := completion{id: job.ID, epoch: job.Epoch, done: make(chan error, 1)}
		w.completions <- c
		// A completion that ran but was not replicated is not retried: the job is completed on this primary,
		// so a retry would find the lease gone and report ErrLeaseLost, which is not what happened.
		err := <-c.done
		if err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotReplicated) {
			return err
		}
		w.recordFailed("completion", job, attempt, err)
		if !sleep(w.records, recordRetry.Delay(attempt)) {
			return err
		}
	}
}

// recordFailed logs an outcome that could not be recorded yet: the first failure and every tenth, so that an
// outage long in seconds leaves a few lines, not one a backoff step.
func (w *Worker) recordFailed(what string, job *Job, attempt int, err error) {
	if attempt == 1 || attempt%10 == 0 {
		w.log.Warn("recording the "+what+" failed; retrying until Redis answers or the drain is over", "job", job.ID,
			"epoch", job.Epoch, "attempts", attempt, "err", err)
	}
}

// completeLoop is a group commit: completions that arrive while one batch runs go together in the next, so
// under load one script call completes many jobs.
func (w *Worker) completeLoop(ctx context.Context) {
	const maxBatch = 256
	batch := make([]completion, 0, maxBatch)
	for {
		batch = batch[:0]
		select {
		case c := <-w.completions:
			batch = append(batch, c)
		case <-ctx.Done():
			return
		}
	gather:
		for len(batch) < maxBatch {
			select {
			case c := <-w.completions:
				batch = append(batch, c)
			default:
				break gather
			}
		}
		args := make([]any, 0, 2+2*len(batch))
		args = append(args, w.q.opts.RetainCompleted, w.q.opts.RetainCompletedFor.Milliseconds(), w.q.dedupWindowMs())
		for _, c := range batch {
			args = append(args, c.id, c.epoch)
		}
		k := w.q.keys
		cctx, cancel := context.WithTimeout(w.records, 10*time.Second)
		cmd, err := w.q.runDurable(cctx, w.rdb, w.q.replicas(cctx), completeScript,
			[]string{k.jobs, k.payloads, k.leases, k.owned, k.done, k.seen, k.epochFloor}, args...)
		var res []int64
		if err == nil {
			res, err = cmd.Int64Slice()
		}
		cancel()
		for i, c := range batch {
			switch {
			case err != nil:
				c.done <- fmt.Errorf("queue: complete %q: %w", c.id, err)
			case res[i] == 1:
				c.done <- nil
			default:
				c.done <- ErrLeaseLost
			}
		}
	}
}

func (w *Worker) fail(job *Job, herr error) (string, error) {
	var perm *PermanentError
	var after *RetryAfterError
	permanent := errors.As(herr, &perm)
	delay := w.retry.Delay(job.Attempt)
	if errors.As(herr, &after) {
		delay = max(after.Delay, 0)
	}
	flag := "0"
	if permanent {
		flag = "1"
	}
	k := w.q.keys
	var err error
	// Retried as complete is, and for the same reason: the failure is recorded, with its backoff, or the job
	// is handed back at close; it is not left for the heartbeat to hand back as a lease it never heard of.
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(w.records, 10*time.Second)
		var res []any
		res, err = failScript.Run(ctx, w.rdb,
			[]string{k.jobs, k.leases, k.owned, k.ready, k.delayed, k.dead, k.marker},
			job.ID, job.Epoch, truncate(herr.Error(), 2048), flag, delay.Milliseconds()).Slice()
		cancel()
		if err == nil {
			if outcome := res[0].(string); outcome != "lost" {
				return outcome, nil
			}
			return "", ErrLeaseLost
		}
		w.recordFailed("failure", job, attempt, err)
		if !sleep(w.records, recordRetry.Delay(attempt)) {
			break
		}
	}
	return "", fmt.Errorf("queue: fail %q: %w", job.ID, err)
}

// release hands the jobs of the runs still holding a lease back and leaves the liveness registry. The runs
// are marked lost, so nothing asks about them again while their handlers wind down.
func (w *Worker) release(ctx context.Context) (int, error) {
	n, err := w.handBack(ctx, true, w.livePairs())
	if err != nil {
		return 0, err
	}
	w.mu.Lock()
	for _, r := range w.runs {
		r.lost = true
	}
	w.mu.Unlock()
	return n, nil
}

// handBack returns the jobs of the given (id, epoch) pairs to the head of the ready list, where this worker
// still holds them; leave also takes the worker out of the liveness registry.
func (w *Worker) handBack(ctx context.Context, leave bool, pairs []any) (int, error) {
	k := w.q.keys
	flag := "0"
	if leave {
		flag = "1"
	}
	n, err := releaseScript.Run(ctx, w.rdb,
		[]string{k.jobs, k.leases, k.owned, k.ready, k.marker, k.workers, k.conns, k.missing},
		append([]any{w.id, flag}, pairs...)...).Int()
	if err != nil {
		return 0, fmt.Errorf("queue: hand back jobs: %w", err)
	}
	return n, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
