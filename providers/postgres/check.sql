-- Describes the configured table $1 (a quoted, possibly schema-qualified name): whether it exists, what kind
-- of relation it is (r a table, p a partitioned one, v a view, ...), whether a unique index covers exactly its
-- effect_id column, which the insert's ON CONFLICT needs and which makes an event unique per effect (checked
-- at once, and valid: ON CONFLICT cannot use a deferrable constraint's index, nor one a failed CREATE INDEX
-- CONCURRENTLY left invalid), and whether a rule rewrites its inserts or updates (ON CONFLICT is refused on
-- such a table).
SELECT to_regclass($1) IS NOT NULL AS exists,
    coalesce((SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)), '') AS kind,
    EXISTS (
        SELECT 1
        FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE i.indrelid = to_regclass($1)
          AND i.indisunique
          AND i.indimmediate
          AND i.indisvalid
          AND i.indnkeyatts = 1
          AND i.indpred IS NULL
          AND a.attname = 'effect_id'
    ) AS unique_effect_id,
    EXISTS (SELECT 1 FROM pg_rewrite w WHERE w.ev_class = to_regclass($1) AND w.ev_type IN ('2', '3')) AS insert_rules
