-- An operator resolves an `unknown` effect as "resend", or retries a failed, dead or unknown one: back to
-- pending with a fresh count of attempts and a due outbox row, and the dispatchers woken. A resend keeps its
-- resolution on the effect; a retry clears an earlier one. Returns no row when the effect is missing or in
-- another state. $1 tenant, $2 key, $3 the statuses it may be in, $4 resolution (resend) or NULL (retry),
-- $5 operator, $6 reason, $7 the outbox channel
WITH e AS (
    UPDATE oncegate_effects
    SET status = 'pending', attempts = 0, next_attempt_at = now(), finished_at = NULL, updated_at = now(),
        resolution = $4, resolved_by = CASE WHEN $4::text IS NULL THEN NULL ELSE $5 END,
        resolved_at = CASE WHEN $4::text IS NULL THEN NULL ELSE now() END,
        resolution_reason = CASE WHEN $4::text IS NULL THEN NULL ELSE $6 END
    WHERE tenant = $1 AND key = $2 AND status = ANY ($3::text[])
    RETURNING {{columns}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type)
    SELECT id, type FROM e
    ON CONFLICT (effect_id) DO UPDATE
    SET run_at = now(), lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL
)
SELECT {{columns}} FROM e, pg_notify($7::text, e.type)
