-- The outbox, if Postgres took its statistics while it was (nearly) empty and it now holds far more rows: an
-- outbox that drained and was vacuumed keeps its pages, and until the next ANALYZE the planner believes it
-- empty, so that a statement may read a whole new burst where it meant to probe a few rows of it (1.85 s a
-- batch of outcomes beside 100,000 rows in the fleet bench, while autovacuum's ANALYZE was a minute away).
-- Fewer rows noted than pages is a table noted as nearly empty; more live rows now (counted by every insert
-- and delete) than twice those noted, and a thousand, is one that is no longer. Not the rows changed since:
-- a queue at work changes thousands of rows a second while it stays as small as noted, and each ANALYZE makes
-- every connection plan again each statement that reads the table. The effects, partitioned since migration
-- 00023, are not asked: their partitions fill and are retired whole, never drained.
SELECT c.relname
FROM pg_class c
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'oncegate_outbox'::regclass
  AND c.relpages > 0 AND c.reltuples < c.relpages
  AND s.n_live_tup > greatest(1000, 2 * c.reltuples)
