-- An operator sends a dead, failed or unknown effect back to pending with a fresh count of attempts; its last
-- error stays for reference. Returns no row when the effect is missing or in another state.
-- $1 tenant, $2 key
WITH effect AS (
    UPDATE oncegate_effects
    SET status = 'pending', attempts = 0, next_attempt_at = now(), finished_at = NULL, updated_at = now()
    WHERE tenant = $1 AND key = $2 AND status IN ('dead', 'failed', 'unknown')
    RETURNING {{columns}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type)
    SELECT id, type FROM effect
    ON CONFLICT (effect_id) DO UPDATE
    SET run_at = now(), lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL
)
SELECT {{columns}} FROM effect, pg_notify('oncegate_outbox', effect.type)
