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
// What Redis acknowledged must also survive Redis. Redis replicates asynchronously: a primary acknowledges a
// write before any replica has it, so a primary that dies, or is cut off from its replicas and Sentinels and
// demoted, loses the writes of its last moments, and a failover then loses acknowledged enqueues, or hands a
// job to a second worker under the epoch of the first. So by default (Options.Replicas, auto) a queue whose
// primary has been seen with a replica acknowledges an enqueue, a lease and a completion only once WAIT, sent
// on the same connection as the script, says a replica has it (WAITAOF, fsynced, on Redis 7.2 and later), and
// keeps doing so when the primary is cut off; a short WAIT is ErrNotReplicated, never a silent ack. With it,
// no acknowledged enqueue is lost to a Sentinel or Cluster failover, a killed primary or a partitioned one, and
// no job reaches a handler under a lease a failover could lose. A primary without replicas is only as durable
// as its AOF (CheckRedis warns). docs/failover.md gives the measured loss without the option.
//
// Because a job can run twice, handlers must make their side effects idempotent; the oncegate gateway exists
// for that. Job.ID and Job.Epoch let a handler name its effects stably and fence them.
//
// Enqueue is idempotent by job ID: while a job with the ID is held in any state, and for Options.DedupWindow
// (24 h by default) after it completed, however many jobs completed since and whether or not its record is
// still retained, an enqueue with that ID adds nothing and returns the existing job. The window is a sorted
// set of completed IDs, {q:NAME}:seen, trimmed as jobs complete; it costs Redis about 120 bytes per 20-byte
// ID and 136 per 36-byte UUID (MEMORY USAGE over 100,000 IDs), so a day at 10 completions a second is about
// 120 MB. A dead job's ID dedups until the job is purged.
//
// Concurrent Enqueue calls on one Queue are group-committed: up to two batches are in flight at once, and
// callers arriving meanwhile wait and go together, up to 512, in the next script call, sent by the first of
// them. Nothing waits on purpose, so a lone producer pays one round trip, and under load one round trip
// carries many jobs. EnqueueMany sends a slice of jobs in one script call per 512.
//
// All keys of a queue share one hash tag, {q:NAME}, and every key a script touches is passed in KEYS, so a
// queue lives on one Redis Cluster slot.
package queue
