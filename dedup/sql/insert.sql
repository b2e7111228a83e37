-- Records a new effect and its outbox row. One statement is one transaction: both rows commit, or neither.
-- When the tenant has used the key already, it inserts nothing and returns no row; of concurrent inserts of
-- one key, the unique constraint lets exactly one through. The NOTIFY wakes dispatchers when it commits.
-- $1 tenant, $2 key, $3 type, $4 fingerprint, $5 payload, $6 trace context (W3C, as JSON) or NULL,
-- $7 the outbox channel (notifier.TopicOutbox), $8 the effect's stable id (effect.NewStableID)
WITH effect AS (
    INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id)
    VALUES ($1, $2, $3, $4, $5, $8)
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING {{columns}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, trace)
    SELECT id, type, $6::jsonb FROM effect
)
SELECT {{columns}} FROM effect, pg_notify($7::text, effect.type)
