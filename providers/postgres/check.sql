-- Describes the configured table $1 (a quoted, possibly schema-qualified name): whether it exists, and whether
-- a unique index covers exactly its effect_id column, which the insert's ON CONFLICT needs and which makes an
-- event unique per effect.
SELECT to_regclass($1) IS NOT NULL AS exists,
    EXISTS (
        SELECT 1
        FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE i.indrelid = to_regclass($1)
          AND i.indisunique
          AND i.indnkeyatts = 1
          AND i.indpred IS NULL
          AND a.attname = 'effect_id'
    ) AS unique_effect_id
