-- An operator sends a retryable effect (effect.RetryableStatuses: failed, dead, unknown) back to pending with a
-- fresh count of attempts; its last error stays for reference. Returns no row when the effect is missing or in
-- another state.
-- $1 tenant, $2 key, $3 pending, $4 the retryable statuses, $5 the outbox channel (notifier.TopicOutbox)
WITH effect AS (
    UPDATE oncegate_effects
    SET status = $3, attempts = 0, next_attempt_at = now(), finished_at = NULL, updated_at = now()
    WHERE tenant = $1 AND key = $2 AND status = ANY ($4::text[])
    RETURNING {{written}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type)
    SELECT id, type FROM effect
    ON CONFLICT (effect_id) DO UPDATE
    SET run_at = now(), lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL
)
SELECT {{written}} FROM effect, pg_notify($5::text, effect.type)
