-- An operator resolves an `unknown` effect as delivered or failed: it becomes terminal with that status, and
-- the resolution (who, when, why) is kept on it. Any outbox row goes (an unknown effect has none, but a
-- resolution must leave nothing to deliver). Returns no row when the effect is missing or not unknown.
-- $1 tenant, $2 key, $3 delivered or failed, $4 operator, $5 reason, $6 the effect-done channel
WITH e AS (
    UPDATE oncegate_effects
    SET status = $3, resolution = $3, resolved_by = $4, resolved_at = now(), resolution_reason = $5,
        finished_at = now(), updated_at = now(), next_attempt_at = NULL,
        delivered_at = CASE WHEN $3 = 'delivered' THEN now() ELSE delivered_at END
    WHERE tenant = $1 AND key = $2 AND status = 'unknown'
    RETURNING {{columns}}
), gone AS (
    DELETE FROM oncegate_outbox o USING e WHERE o.effect_id = e.id
)
SELECT {{columns}} FROM e, pg_notify($6::text, e.id::text)
