-- Sends an effect back to pending with a fresh count of attempts and a due outbox row, and wakes the
-- dispatchers: the one statement behind a tenant's retry (POST /v1/effects/{key}/retry), an operator's retry
-- and an operator's "resend" resolution of an `unknown` effect. A resend keeps its resolution on the effect; a
-- retry clears an earlier one, so that an effect retried after an operator resolved it never reads "delivered
-- (resolved failed)". Its last error stays for reference. The attempt log gets a row saying who sent it back
-- and why (outcome retried or resent, attempt 0): the attempts after it are a new series, numbered from 1
-- again, and the history before it stays. Returns no row when the effect is missing or in a status not in $3.
-- The effect is the one the key points at now (oncegate_keys): after the key was claimed again, the new one.
-- $1 tenant, $2 key, $3 the statuses it may be in, $4 resolution (resend) or NULL (retry), $5 operator,
-- $6 reason, $7 the outbox channel (notifier.TopicOutbox), $8 pending, $9 who, as the attempt log names them
-- ("operator alice", "tenant acme")
WITH effect AS (
    UPDATE oncegate_effects
    SET status = $8, attempts = 0, next_attempt_at = now(), finished_at = NULL, updated_at = now(),
        resolution = $4,
        resolved_by = CASE WHEN $4::text IS NULL THEN NULL ELSE $5::text END,
        resolved_at = CASE WHEN $4::text IS NULL THEN NULL ELSE now() END,
        resolution_reason = CASE WHEN $4::text IS NULL THEN NULL ELSE $6::text END
    WHERE id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = $1 AND k.key = $2) AND tenant = $1
        AND status = ANY ($3::text[])
        -- Its payload is still there to send: an effect whose body expired (retention.payloads) stays as it is.
        AND (payload IS NOT NULL OR legacy_payload IS NOT NULL
            OR EXISTS (SELECT FROM oncegate_effect_bodies b WHERE b.effect_id = oncegate_effects.id))
    RETURNING {{written}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, tenant)
    SELECT id, type, tenant FROM effect
    ON CONFLICT (effect_id) DO UPDATE
    SET run_at = now(), lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, interrupted = 0
), marked AS (
    INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome, error)
    SELECT id, 0, now(), $9, CASE WHEN $4::text IS NULL THEN 'retried' ELSE 'resent' END, NULLIF($6::text, '')
    FROM effect
)
SELECT {{written}} FROM effect, pg_notify($7::text, effect.type)
