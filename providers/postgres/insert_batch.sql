-- Inserts the analytics events of many effects in one statement, as insert.sql does for one, and returns the
-- row id of each effect's event: the new row, or the one an earlier attempt inserted (the unique constraint on
-- effect_id keeps one event per effect). {{table}} is the configured table, validated and quoted.
-- $1 tenants, $2 keys, $3 names, $4 properties (JSON text or NULL), $5 occurred_at (RFC 3339 text or NULL for
-- the time of insert), $6 effect ids (stable ids); paired by index. Earlier events are read effect by effect
-- (LATERAL ... LIMIT 1), so that the plan probes the unique index however small the table was when it was made.
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
        AS i (tenant, key, name, properties, occurred_at, effect_id)
), ins AS (
    INSERT INTO {{table}} (tenant, key, name, properties, occurred_at, effect_id)
    SELECT tenant, key, name, properties::jsonb, COALESCE(occurred_at::timestamptz, now()), effect_id
    FROM input
    ON CONFLICT (effect_id) DO NOTHING
    RETURNING effect_id, id
)
SELECT effect_id, id FROM ins
UNION ALL
SELECT input.effect_id, t.id
FROM input CROSS JOIN LATERAL (SELECT id FROM {{table}} t WHERE t.effect_id = input.effect_id LIMIT 1) t
