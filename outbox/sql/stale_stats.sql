-- The hot tables whose statistics Postgres took while they were (nearly) empty, and that have changed much
-- since: an outbox that drained and was vacuumed keeps its pages, and until the next ANALYZE the planner
-- believes it empty, so that a statement may read a whole new burst where it meant to probe a few rows of it
-- (1.85 s a batch of outcomes beside 100,000 rows in the fleet bench, while autovacuum's ANALYZE was a
-- minute away). Fewer rows noted than pages is a table noted as nearly empty; more rows changed since than
-- were noted is one that is no longer.
SELECT c.relname
FROM pg_class c
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid IN ('oncegate_outbox'::regclass, 'oncegate_effects'::regclass)
  AND c.relpages > 0 AND c.reltuples < c.relpages
  AND s.n_mod_since_analyze > greatest(1000, c.reltuples)
