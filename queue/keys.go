package queue

// keys names every Redis key of one queue. They share the hash tag {q:NAME}, so a queue's scripts run on one
// Redis Cluster slot. Nothing else in the package builds a key name.
type keys struct {
	prefix                                                                        string
	jobs, payloads, ready, delayed, leases, owned, workers, marker, done, dead    string
	conns, missing, sweeper, sweepGuard, seen, leaseSeq, paused, epochFloor, sync string
}

func newKeys(name string) keys {
	p := "{q:" + name + "}:"
	return keys{
		prefix:     p,
		jobs:       p + "jobs",     // hash: id -> job record (JSON)
		payloads:   p + "payloads", // hash: id -> payload
		ready:      p + "ready",    // list of ids, oldest first
		delayed:    p + "delayed",  // zset: id -> run_at ms
		leases:     p + "leases",   // zset: id -> lease deadline ms
		owned:      p + "owned",    // zset (lex): "<worker id>:<job id>"
		workers:    p + "workers",  // zset: worker id -> seen-alive-until ms (for Stats)
		conns:      p + "conns",    // hash: worker id -> "<server run id>:<client id>" of its liveness connection
		missing:    p + "missing",  // hash: worker id -> ms its liveness connection was first seen gone
		leaseSeq:   p + "leaseseq", // counter: one number per lease call, recorded in the jobs it leased
		sweeper:    p + "sweeper",  // hash: run_id, since (ms it was first seen), last (ms of the last sweep)
		marker:     p + "marker",   // zset idle workers block on
		done:       p + "done",     // zset: id -> finished_at ms (retained completed jobs)
		dead:       p + "dead",     // zset: id -> died at ms
		sweepGuard: p + "sweep",    // string with a TTL: a sweep ran within the interval
		seen:       p + "seen",     // zset: id -> finished_at ms, completed IDs within the dedup window
		paused:     p + "paused",   // string: present while an operator has paused the queue (the reason)
		// string: the highest epoch of the jobs that completed or were purged; a new job's first lease
		// starts above it, so an ID used again never holds an epoch its earlier job held (lease.lua)
		epochFloor: p + "epochfloor",
		// string: written by a durable enqueue that added nothing, so that its WAIT waits for the replication
		// of what it found (replication.go)
		sync: p + "sync",
	}
}

// all lists every key, for tests and for Queue.Destroy.
func (k keys) all() []string {
	return []string{k.jobs, k.payloads, k.ready, k.delayed, k.leases, k.owned, k.workers, k.marker, k.done,
		k.dead, k.conns, k.missing, k.sweeper, k.sweepGuard, k.seen, k.leaseSeq, k.paused, k.epochFloor, k.sync}
}

// wake is a worker process's own wake-up key, which its fetcher blocks on beside the shared marker, so that a
// closing worker can wake its own fetcher at once.
func (k keys) wake(workerID string) string { return k.prefix + "wake:" + workerID }
