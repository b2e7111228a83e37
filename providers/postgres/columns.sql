-- Describes the columns of the configured table $1 (a quoted, possibly schema-qualified name), so that a table
-- whose columns cannot take what insert.sql writes (a missing column, occurred_at as a date, which dropped the
-- time and the offset without an error) is refused as the gateway starts, not found by every delivery failing.
-- One row, a JSON array of {name, type, not_null, has_default, identity, sequence, generated}: a column with a
-- default or an identity may be left out of the insert; a generated one cannot be written at all; sequence
-- says the column draws a new value for each row (an identity, or a default that calls nextval: serial).
SELECT coalesce(json_agg(json_build_object(
        'name', a.attname,
        'type', format_type(a.atttypid, a.atttypmod),
        'not_null', a.attnotnull,
        'has_default', a.atthasdef AND a.attgenerated = '',
        'identity', a.attidentity <> '',
        -- A default that draws from a sequence depends on it (serial, or nextval of one's own), read from
        -- pg_depend: pg_get_expr would lock the table, and a gateway started while a migration held it waited.
        'sequence', a.attidentity <> '' OR EXISTS (
            SELECT 1 FROM pg_depend dep JOIN pg_class s ON s.oid = dep.refobjid AND s.relkind = 'S'
            WHERE dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid),
        'generated', a.attgenerated <> '')
    ORDER BY a.attnum), '[]')
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
