-- Raises a queue job's fence to the epoch of the request, in the transaction that then records the effect.
-- Returns no row when the fence is above the epoch already: the job was leased again since, and the asking
-- worker may not start effects any more. The upsert locks the job's row, so one job's requests queue on it.
-- $1 tenant, $2 job id, $3 epoch
INSERT INTO oncegate_job_fences AS f (tenant, job_id, epoch)
VALUES ($1, $2, $3)
ON CONFLICT (tenant, job_id) DO UPDATE
SET epoch = EXCLUDED.epoch, updated_at = now()
WHERE f.epoch <= EXCLUDED.epoch
RETURNING epoch
