-- The partitions of table $1, oldest first: name, whether a DETACH ... CONCURRENTLY of it is pending (begun and
-- not finished: the gateway running it was killed, or its wait ran out), and its bounds as times (NULL:
-- MINVALUE or MAXVALUE). The bounds are read back from the catalogue's text: timestamptz literals with their
-- offset, or, when $2 (a table partitioned by effect id, migration 00023), effect ids, whose top bits are
-- the seconds since 2025-01-01 UTC.
SELECT c.relname::text, i.inhdetachpending,
    CASE WHEN $2 THEN to_timestamp(1735689600 + (lo.v::bigint >> 22)) ELSE lo.v::timestamptz END AS lower,
    CASE WHEN $2 THEN to_timestamp(1735689600 + (hi.v::bigint >> 22)) ELSE hi.v::timestamptz END AS upper
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL pg_get_expr(c.relpartbound, c.oid) AS b (bound)
CROSS JOIN LATERAL (SELECT (regexp_match(b.bound, 'FROM \(''([^'']+)''\)'))[1]) AS lo (v)
CROSS JOIN LATERAL (SELECT (regexp_match(b.bound, 'TO \(''([^'']+)''\)'))[1]) AS hi (v)
WHERE i.inhparent = $1::regclass
ORDER BY upper NULLS LAST
