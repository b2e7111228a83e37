-- Raises a queue job's fence to the token of the request, in the transaction that then records the effect.
-- The token is (the job's creation in its queue, unix ms; its lease epoch), compared in that order (migration
-- 00034): a later lease of the job, or a job enqueued again under its ID, is newer. Returns no row when the
-- fence is above the token already: the job was leased again since, or is a newer job, and the asking worker
-- may not start effects any more. The upsert locks the job's row, so one job's requests queue on it.
-- $1 tenant, $2 queue ('' when the client named none), $3 job id, $4 creation (0: not sent), $5 epoch
INSERT INTO oncegate_run_fences AS f (tenant, queue, job_id, created_ms, epoch)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant, queue, job_id) DO UPDATE
SET created_ms = EXCLUDED.created_ms, epoch = EXCLUDED.epoch, updated_at = now()
WHERE (f.created_ms, f.epoch) <= (EXCLUDED.created_ms, EXCLUDED.epoch)
RETURNING epoch
