-- Raises a queue job's fence to the token of the request, in the transaction that then records the effect.
-- The token is (the job's creation in its queue, unix ms; its lease epoch), compared in that order (migration
-- 00034): a later lease of the job, or a job enqueued again under its ID, is newer. A client that sends no
-- creation (0, a worker of an older version) is ranked by its epoch alone against the fence, and leaves the
-- fence's creation as it was, so that a rolling upgrade's old and new workers of one job still fence each
-- other by epoch (ranked below every creation, an old worker's stale run of a job was taken as the newer, and
-- its successor's next run refused). The upsert locks the job's row, so one job's requests queue on it.
--
-- The fence of the version before 00034 (oncegate_job_fences: one epoch per tenant and job ID) is raised too,
-- never lowered, so that gateways of that version, in the fleet during a rolling upgrade or after a rollback,
-- fence what gateways of this one saw. A request without a creation is refused by it as well: that is how
-- such a request was fenced before, by every gateway of the fleet. A request with a creation is refused by it
-- when a gateway of that version raised it after this version last raised the job's fence: a successor's
-- run went through an old gateway (an outside test). Its updated_at tells: the old gateways set it to their
-- now(), this version leaves it as it was (-infinity in a row it inserts), so that a later updated_at than
-- the job's fence is an old gateway's write (this version's writes for the job's ID in another queue raise
-- the old row too, and would otherwise read as one). The old fence is upserted first, so that every request locks the two rows in
-- one order (the other order, for some requests, deadlocked requests with and without a creation).
-- Returns no row when the request is refused: the job was leased again since, or is a newer job, and the
-- asking worker may not start effects any more. (The transaction is then rolled back: neither fence moves.)
-- $1 tenant, $2 queue ('' when the client named none), $3 job id, $4 creation (0: not sent), $5 epoch
WITH found AS (
    -- Both fences as the statement found them (every part of one statement reads the same snapshot).
    SELECT (SELECT updated_at FROM oncegate_job_fences WHERE tenant = $1 AND job_id = $3) AS old_at,
           (SELECT updated_at FROM oncegate_run_fences WHERE tenant = $1 AND queue = $2 AND job_id = $3) AS at
), before_00034 AS (
    INSERT INTO oncegate_job_fences AS f (tenant, job_id, epoch, updated_at)
    VALUES ($1, $3, $5, '-infinity')
    ON CONFLICT (tenant, job_id) DO UPDATE SET epoch = EXCLUDED.epoch
    WHERE f.epoch <= EXCLUDED.epoch
    RETURNING epoch
), old AS (
    SELECT EXISTS (SELECT FROM before_00034) AS taken
), raised AS (
    -- Selected from old, so that the old fence's upsert has run (and locked its row) before this one.
    INSERT INTO oncegate_run_fences AS f (tenant, queue, job_id, created_ms, epoch)
    SELECT $1, $2, $3, $4, $5 FROM old
    ON CONFLICT (tenant, queue, job_id) DO UPDATE
    SET created_ms = CASE WHEN EXCLUDED.created_ms = 0 THEN f.created_ms ELSE EXCLUDED.created_ms END,
        epoch = EXCLUDED.epoch, updated_at = now()
    WHERE CASE WHEN EXCLUDED.created_ms = 0 OR f.created_ms = 0 THEN f.epoch <= EXCLUDED.epoch
               ELSE (f.created_ms, f.epoch) <= (EXCLUDED.created_ms, EXCLUDED.epoch) END
    RETURNING epoch
)
SELECT r.epoch FROM raised r, old o, found w
WHERE o.taken OR ($4::bigint <> 0 AND NOT coalesce(w.old_at > w.at, false))
