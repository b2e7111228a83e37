-- The tenants that hold an effect under key, for `effect show KEY` without --tenant (served by the
-- (key text_pattern_ops) index). At most 2: one is the answer, two says that --tenant is needed. A key claimed
-- again has two effects of one tenant under it until the purge: DISTINCT. $1 key
SELECT DISTINCT tenant FROM oncegate_effects WHERE key = $1 ORDER BY tenant LIMIT 2
