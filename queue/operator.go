package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Reads for operator tools (package admin), beside Stats, Job and DeadJobs: each a few commands on one
// queue's keys, whatever the queue's size.

// Jobs lists up to limit jobs in state, from offset: ready jobs oldest first (the order they will run in),
// delayed jobs by run time, active ones by lease deadline, completed and dead ones most recent first.
func (q *Queue) Jobs(ctx context.Context, state JobState, offset, limit int) ([]*Job, error) {
	if limit <= 0 {
		return nil, nil
	}
	k := q.keys
	start, stop := int64(offset), int64(offset+limit-1)
	var ids []string
	var err error
	switch state {
	case StateReady:
		ids, err = q.rdb.LRange(ctx, k.ready, start, stop).Result()
	case StateDelayed:
		ids, err = q.rdb.ZRange(ctx, k.delayed, start, stop).Result()
	case StateActive:
		ids, err = q.rdb.ZRange(ctx, k.leases, start, stop).Result()
	case StateCompleted:
		ids, err = q.rdb.ZRevRange(ctx, k.done, start, stop).Result()
	case StateDead:
		ids, err = q.rdb.ZRevRange(ctx, k.dead, start, stop).Result()
	default:
		return nil, fmt.Errorf("queue: unknown job state %q", state)
	}
	if err != nil {
		return nil, fmt.Errorf("queue: list %s jobs: %w", state, err)
	}
	return q.jobsByID(ctx, ids)
}

// jobsByID reads the records of ids in one round trip, skipping those purged meanwhile.
func (q *Queue) jobsByID(ctx context.Context, ids []string) ([]*Job, error) {
	if len(ids) == 0 {
		return []*Job{}, nil
	}
	recs := make([]*redis.StringCmd, len(ids))
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			recs[i] = p.HGet(ctx, q.keys.jobs, id)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("queue: read jobs: %w", err)
	}
	out := make([]*Job, 0, len(ids))
	for i, c := range recs {
		if c.Err() != nil {
			continue
		}
		j := readJob(c.Val(), nil)
		j.ID = ids[i] // the hash field, which every script keys the job by
		out = append(out, j)
	}
	return out, nil
}

// LeaseDeadline returns when an active job's lease runs out; zero when the job holds no lease.
func (q *Queue) LeaseDeadline(ctx context.Context, id string) (time.Time, error) {
	ms, err := q.rdb.ZScore(ctx, q.keys.leases, id).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("queue: lease of %q: %w", id, err)
	}
	return msTime(int64(ms)), nil
}

// WorkerInfo is a worker process as the queue knows it.
type WorkerInfo struct {
	ID string
	// SeenUntil is how long its last sign of life counts; Alive is whether that is still ahead, by Redis's
	// clock.
	SeenUntil time.Time
	Alive     bool
	// Jobs are the IDs of the jobs it holds leases on.
	Jobs []string
}

// Workers lists the worker processes that registered with the queue and have not left it, the live ones and
// those whose liveness ran out (a crash the sweeper has not yet handled), with the jobs each holds.
func (q *Queue) Workers(ctx context.Context) ([]WorkerInfo, error) {
	k := q.keys
	var ws *redis.ZSliceCmd
	var now *redis.TimeCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		ws = p.ZRangeWithScores(ctx, k.workers, 0, -1)
		now = p.Time(ctx)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue: list workers: %w", err)
	}
	out := make([]WorkerInfo, 0, len(ws.Val()))
	held := make([]*redis.StringSliceCmd, len(ws.Val()))
	_, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, z := range ws.Val() {
			id := z.Member.(string)
			held[i] = p.ZRangeByLex(ctx, k.owned, &redis.ZRangeBy{Min: "[" + id + ":", Max: "[" + id + ";"})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue: list workers' jobs: %w", err)
	}
	for i, z := range ws.Val() {
		id := z.Member.(string)
		w := WorkerInfo{ID: id, SeenUntil: msTime(int64(z.Score)), Jobs: []string{}}
		w.Alive = int64(z.Score) >= now.Val().UnixMilli()
		for _, m := range held[i].Val() {
			w.Jobs = append(w.Jobs, m[len(id)+1:])
		}
		out = append(out, w)
	}
	return out, nil
}

// Now returns Redis's clock, which every time in the queue is measured by.
func (q *Queue) Now(ctx context.Context) (time.Time, error) {
	t, err := q.rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("queue: time: %w", err)
	}
	return t, nil
}
