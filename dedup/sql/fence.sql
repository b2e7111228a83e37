-- Raises a queue job's fence to the token of the request, in the transaction that then records the effect.
-- The token is (the job's creation in its queue, unix ms; its lease epoch), compared in that order (migration
-- 00034): a later lease of the job, or a job enqueued again under its ID, is newer. A client that sends no
-- creation (0, a worker of an older version) is ranked by its epoch alone against the fence, and leaves the
-- fence's creation as it was, so that a rolling upgrade's old and new workers of one job still fence each
-- other by epoch (ranked below every creation, an old worker's stale run of a job was taken as the newer, and
-- its successor's next run refused). Returns no row when the fence is above the token already: the job was
-- leased again since, or is a newer job, and the asking worker may not start effects any more. The upsert
-- locks the job's row, so one job's requests queue on it.
-- $1 tenant, $2 queue ('' when the client named none), $3 job id, $4 creation (0: not sent), $5 epoch
INSERT INTO oncegate_run_fences AS f (tenant, queue, job_id, created_ms, epoch)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant, queue, job_id) DO UPDATE
SET created_ms = CASE WHEN EXCLUDED.created_ms = 0 THEN f.created_ms ELSE EXCLUDED.created_ms END,
    epoch = EXCLUDED.epoch, updated_at = now()
WHERE CASE WHEN EXCLUDED.created_ms = 0 OR f.created_ms = 0 THEN f.epoch <= EXCLUDED.epoch
           ELSE (f.created_ms, f.epoch) <= (EXCLUDED.created_ms, EXCLUDED.epoch) END
RETURNING epoch
