-- Tables named as partitions of $1 ($2: a LIKE pattern of their names, $3 the old table the migration kept as
-- the first partition) that are no partition of it: a
-- partition detached whose DROP did not run (the gateway was killed between the two). The manager names its
-- partitions, and creates and attaches each in one transaction, so a table so named and unattached is one
-- it detached. The pattern is only a first cut: the caller keeps the names that are exactly the manager's,
-- table_pYYYYMMDDtHHMMSS (nameTime), and leaves alone an operator's oncegate_effects_pre_upgrade.
SELECT c.relname::text
FROM pg_class c
WHERE c.relkind = 'r' AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $1::regclass)
    AND (c.relname LIKE $2 OR c.relname = $3)
    AND NOT EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = c.oid)
