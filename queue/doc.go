// Package queue is a Redis lease queue for background jobs that must not be lost.
//
// A producer enqueues jobs (Queue.Enqueue); worker processes lease them (Worker). A lease is a deadline in a
// sorted set plus a fencing epoch that grows with every lease, so that only the worker holding the current
// lease can complete, fail or extend it: a worker whose lease was taken away gets ErrLeaseLost and changes
// nothing. Every state change is one Lua script run atomically by Redis, and every deadline comes from Redis's
// clock, never a worker's.
//
// The guarantee is at-least-once: a job that was enqueued runs until it completes or is dead, even when its
// worker is killed mid-job; and a job runs again only when its worker is really gone. Each worker process keeps
// a Redis connection of its own and registers it; a process that dies closes it. The sweeper, run by every
// worker but at most once per interval across all of them, hands the jobs of a process whose connection is
// gone back to ready within a second, without waiting for their per-job lease. A process that is frozen, slow,
// or starving its own connection pool keeps its connection, and keeps its jobs until their lease runs out; a
// Redis stall is not held against anyone. A job that keeps killing its workers is dead after MaxStalls, with
// the reason recorded. docs/queue.md explains the mechanism.
//
// Because a job can run twice, handlers must make their side effects idempotent; the oncegate gateway exists
// for that. Job.ID and Job.Epoch let a handler name its effects stably and fence them.
//
// All keys of a queue share one hash tag, {q:NAME}, and every key a script touches is passed in KEYS, so a
// queue lives on one Redis Cluster slot.
package queue
