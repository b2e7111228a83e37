-- One batch of an operator's bulk retry: up to $8 effects in one of the statuses $9 matching the filter, below
-- the id the previous batch ended at, back to pending with due outbox rows, newest first, as send_back.sql
-- does for one (an earlier resolution cleared). SKIP LOCKED leaves rows that another operator's action holds.
-- Returns the ids retried and their types.
-- $1 tenant, $2 type, $3 status, $4 key LIKE pattern, $5 created at or after, $6 job id, $7 id below, $8 size,
-- $9 the statuses it may be in, $10 pending, $11 a search term, lowercased, $12 the search as
-- typed (as effects_list.sql's $9 and $10), $13 who (as send_back.sql's $9), $14 why. Each effect's attempt
-- log gets the row send_back.sql writes.
WITH picked AS (
    SELECT id FROM oncegate_effects
    WHERE ($1::text IS NULL OR tenant = $1)
      AND ($2::text IS NULL OR type = $2)
      AND ($3::text IS NULL OR status = $3)
      AND ($4::text IS NULL OR key LIKE $4)
      AND ($5::timestamptz IS NULL OR created_at >= $5)
      AND ($6::text IS NULL OR job_id = $6)
      AND ($7::bigint IS NULL OR id < $7)
      AND ($11::text IS NULL OR search_terms @> ARRAY[$11::text] OR key = $12)
      AND status = ANY ($9::text[])
      -- Its payload is still there to send (send_back.sql).
      AND (payload IS NOT NULL OR legacy_payload IS NOT NULL
          OR EXISTS (SELECT FROM oncegate_effect_bodies b WHERE b.effect_id = oncegate_effects.id))
    ORDER BY id DESC
    LIMIT $8
    FOR UPDATE SKIP LOCKED
), effect AS (
    UPDATE oncegate_effects x
    SET status = $10, attempts = 0, next_attempt_at = now(), finished_at = NULL, updated_at = now(),
        resolution = NULL, resolved_by = NULL, resolved_at = NULL, resolution_reason = NULL
    FROM picked
    WHERE x.id = picked.id
    RETURNING x.id, x.type, x.tenant
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, tenant)
    SELECT id, type, tenant FROM effect
    ON CONFLICT (effect_id) DO UPDATE
    SET run_at = now(), lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, interrupted = 0
), marked AS (
    INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome, error)
    SELECT id, 0, now(), $13, 'retried', NULLIF($14::text, '') FROM effect
)
SELECT id, type FROM effect
