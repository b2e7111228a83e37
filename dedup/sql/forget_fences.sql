-- Forgets the fences of queue jobs that raised none for $1 ms (the keys' hold, retention.keys): a fence is for
-- a worker that lost its job's lease and still runs, which its lease's end and the queue's sweeper make a
-- matter of seconds or minutes, and oncegate_run_fences had a row for every job ID ever seen. At most $2
-- rows a call, the oldest first; rows another gateway is deleting are skipped, not waited for. Returns how
-- many were deleted.
WITH gone AS (
    DELETE FROM oncegate_run_fences
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM oncegate_run_fences
        WHERE updated_at < now() - make_interval(secs => $1::double precision / 1000)
        ORDER BY updated_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) FROM gone
