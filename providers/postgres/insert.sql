-- Inserts one analytics event for effect $6 (its stable id). {{table}} is the configured table, validated as
-- an identifier and quoted. The unique constraint on effect_id makes a second insert for one effect change
-- nothing and return the first row's id; a key used again after retention is a new effect with a new id, so
-- its event is a new row.
WITH ins AS (
    INSERT INTO {{table}} (tenant, key, name, properties, occurred_at, effect_id)
    VALUES ($1, $2, $3, $4, COALESCE($5, now()), $6)
    ON CONFLICT (effect_id) DO NOTHING
    RETURNING id
)
SELECT id FROM ins
UNION ALL
SELECT id FROM {{table}} WHERE effect_id = $6
LIMIT 1
