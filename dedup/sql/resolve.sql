-- An operator resolves an `unknown` effect as delivered or failed: it becomes terminal with that status, and
-- the resolution (who, when, why) is kept on it. Any outbox row goes (an unknown effect has none, but a
-- resolution must leave nothing to deliver). Its delivered_at stays as it was: nobody saw it delivered, and
-- the resolution says when it was resolved (the console showed the click's time as the delivery's). The
-- attempt log gets a row saying who resolved it and why. Returns no row when the effect is missing or not
-- unknown. The effect is the one the key points at now (oncegate_keys).
-- $1 tenant, $2 key, $3 delivered or failed, $4 operator, $5 reason, $6 the effect-done channel, $7 unknown,
-- $8 who, as the attempt log names them
WITH effect AS (
    UPDATE oncegate_effects
    SET status = $3, resolution = $3, resolved_by = $4, resolved_at = now(), resolution_reason = $5,
        finished_at = now(), updated_at = now(), next_attempt_at = NULL
    WHERE id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = $1 AND k.key = $2) AND tenant = $1
        AND status = $7
    RETURNING {{written}}
), gone AS (
    -- By the primary key whatever the join order (finish_batch.sql says why).
    DELETE FROM oncegate_outbox o WHERE o.effect_id = (SELECT effect.id FROM effect)
), marked AS (
    INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, outcome, error)
    SELECT id, 0, now(), $8, 'resolved ' || $3, $5 FROM effect
)
SELECT {{written}} FROM effect, pg_notify($6::text, effect.id::text)
