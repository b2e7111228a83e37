-- Inserts one analytics event. {{table}} is the configured table, validated as an identifier and quoted. A second
-- insert of one (tenant, key) changes nothing and returns the first row's id.
WITH ins AS (
    INSERT INTO {{table}} (tenant, key, name, properties, occurred_at)
    VALUES ($1, $2, $3, $4, COALESCE($5, now()))
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING id
)
SELECT id FROM ins
UNION ALL
SELECT id FROM {{table}} WHERE tenant = $1 AND key = $2
LIMIT 1
