-- The partitions of table $1, oldest first: name, whether a DETACH ... CONCURRENTLY of it is pending (begun and
-- not finished: the gateway running it was killed, or its wait ran out), and its bounds (NULL: MINVALUE or
-- MAXVALUE). The bounds are read back from the catalogue's text, as timestamptz literals with their offset.
SELECT c.relname::text, i.inhdetachpending,
    (regexp_match(b.bound, 'FROM \(''([^'']+)''\)'))[1]::timestamptz AS lower,
    (regexp_match(b.bound, 'TO \(''([^'']+)''\)'))[1]::timestamptz AS upper
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL pg_get_expr(c.relpartbound, c.oid) AS b (bound)
WHERE i.inhparent = $1::regclass
ORDER BY upper NULLS LAST
