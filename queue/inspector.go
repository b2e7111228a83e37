package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Stats is a snapshot of a queue, for dashboards and metrics.
type Stats struct {
	// Counts has one entry per state of JobStates.
	Counts map[JobState]int64
	// OldestReady is how long the oldest ready job has waited for a worker; zero when none waits.
	OldestReady time.Duration
	// Workers is how many worker processes are alive (liveness not yet run out).
	Workers int64
}

// Stats reads the queue's counts and the age of its oldest ready job, measured with Redis's clock.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	k := q.keys
	var ready, delayed, active, done, dead *redis.IntCmd
	var head *redis.StringCmd
	var now *redis.TimeCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		ready = p.LLen(ctx, k.ready)
		delayed = p.ZCard(ctx, k.delayed)
		active = p.ZCard(ctx, k.leases)
		done = p.ZCard(ctx, k.done)
		dead = p.ZCard(ctx, k.dead)
		head = p.LIndex(ctx, k.ready, 0)
		now = p.Time(ctx)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Stats{}, fmt.Errorf("queue: stats: %w", err)
	}
	s := Stats{Counts: map[JobState]int64{
		StateReady: ready.Val(), StateDelayed: delayed.Val(), StateActive: active.Val(),
		StateCompleted: done.Val(), StateDead: dead.Val(),
	}}
	if id := head.Val(); id != "" {
		if j, err := q.Job(ctx, id); err == nil && !j.ReadyAt.IsZero() {
			s.OldestReady = max(now.Val().Sub(j.ReadyAt), 0)
		}
	}
	s.Workers, err = q.rdb.ZCount(ctx, k.workers, fmt.Sprint(now.Val().UnixMilli()), "+inf").Result()
	if err != nil {
		return Stats{}, fmt.Errorf("queue: stats: %w", err)
	}
	return s, nil
}

// Job finds a job by ID in any state. It returns ErrNotFound when the queue does not hold it.
func (q *Queue) Job(ctx context.Context, id string) (*Job, error) {
	var rec, payload *redis.StringCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		rec = p.HGet(ctx, q.keys.jobs, id)
		payload = p.HGet(ctx, q.keys.payloads, id)
		return nil
	})
	if errors.Is(rec.Err(), redis.Nil) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("queue: get job %q: %w", id, err)
	}
	j := readJob(rec.Val(), []byte(payload.Val()))
	j.ID = id // the hash field, which every script keys the job by
	return j, nil
}

// DeadJobs lists dead jobs, most recently dead first, skipping offset and returning at most limit.
func (q *Queue) DeadJobs(ctx context.Context, offset, limit int) ([]*Job, error) {
	if limit <= 0 {
		return nil, nil
	}
	ids, err := q.rdb.ZRevRange(ctx, q.keys.dead, int64(offset), int64(offset+limit-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("queue: list dead jobs: %w", err)
	}
	jobs := make([]*Job, 0, len(ids))
	for _, id := range ids {
		j, err := q.Job(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue // purged between the two reads
		}
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// RequeueDead sends dead jobs back to ready with fresh attempt and stall counts. IDs of jobs that are not dead
// are ignored; it returns how many were requeued.
func (q *Queue) RequeueDead(ctx context.Context, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	k := q.keys
	n, err := requeueDeadScript.Run(ctx, q.rdb, []string{k.jobs, k.dead, k.ready, k.marker}, toArgs(ids)...).Int()
	if err != nil {
		return 0, fmt.Errorf("queue: requeue dead jobs: %w", err)
	}
	return n, nil
}

// PurgeDead deletes dead jobs for good; their IDs can then be enqueued again. IDs of jobs that are not dead
// are ignored; it returns how many were purged.
func (q *Queue) PurgeDead(ctx context.Context, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	k := q.keys
	n, err := purgeDeadScript.Run(ctx, q.rdb, []string{k.jobs, k.payloads, k.dead, k.epochFloor}, toArgs(ids)...).Int()
	if err != nil {
		return 0, fmt.Errorf("queue: purge dead jobs: %w", err)
	}
	return n, nil
}

func toArgs(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
