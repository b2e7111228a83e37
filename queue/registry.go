package queue

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/redis/go-redis/v9"
)

// DefaultRegistry is the Redis key of the set of queue names (Options.Registry).
const DefaultRegistry = "oncegate:queues"

// register adds the queue's name to the registry, once per Queue: a failure is logged and tried again at the
// next enqueue, and never fails the enqueue, since the registry serves operator tools, not the queue.
func (q *Queue) register(ctx context.Context) {
	if q.registered.Load() {
		return
	}
	if err := q.rdb.SAdd(context.WithoutCancel(ctx), q.opts.Registry, q.name).Err(); err != nil {
		q.opts.Logger.Warn("could not add the queue to the registry of queue names; trying again at the next enqueue",
			"queue", q.name, "registry", q.opts.Registry, "err", err)
		return
	}
	q.registered.Store(true)
}

// Queues lists the names in the registry at key (DefaultRegistry if empty), sorted: every queue that was
// enqueued to or worked on, until Destroy. The set holds names only, so a queue of a million jobs and one of
// none cost it the same.
func Queues(ctx context.Context, rdb redis.UniversalClient, key string) ([]string, error) {
	if key == "" {
		key = DefaultRegistry
	}
	names, err := rdb.SMembers(ctx, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("queue: list queues: %w", err)
	}
	sort.Strings(names)
	return names, nil
}

// Pause stops the queue's workers from leasing: jobs keep being enqueued, and wait, ready, until Resume.
// Jobs already running finish. reason is kept in the flag, for Paused. The lease script checks the flag, so
// a pause holds for every worker at its next lease, with no restart.
func (q *Queue) Pause(ctx context.Context, reason string) error {
	if reason == "" {
		reason = "paused"
	}
	if err := q.rdb.Set(ctx, q.keys.paused, reason, 0).Err(); err != nil {
		return fmt.Errorf("queue: pause %s: %w", q.name, err)
	}
	return nil
}

// PauseOnce is Pause for a queue that is not paused yet: it reports whether it paused the queue, and leaves
// a pause already in place (its reason and time) as it is.
func (q *Queue) PauseOnce(ctx context.Context, reason string) (bool, error) {
	if reason == "" {
		reason = "paused"
	}
	ok, err := q.rdb.SetNX(ctx, q.keys.paused, reason, 0).Result()
	if err != nil {
		return false, fmt.Errorf("queue: pause %s: %w", q.name, err)
	}
	return ok, nil
}

// Resume lets the queue's workers lease again and wakes them. It reports whether the queue was paused.
func (q *Queue) Resume(ctx context.Context) (bool, error) {
	n, err := resumeScript.Run(ctx, q.rdb, []string{q.keys.paused, q.keys.marker}).Int()
	if err != nil {
		return false, fmt.Errorf("queue: resume %s: %w", q.name, err)
	}
	return n == 1, nil
}

// Paused reports whether the queue is paused, and the reason given.
func (q *Queue) Paused(ctx context.Context) (bool, string, error) {
	reason, err := q.rdb.Get(ctx, q.keys.paused).Result()
	if errors.Is(err, redis.Nil) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("queue: paused %s: %w", q.name, err)
	}
	return true, reason, nil
}
