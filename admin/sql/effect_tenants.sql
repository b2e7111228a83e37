-- The tenants that hold an effect under key, for `effect show KEY` without --tenant (served by the
-- (key text_pattern_ops) index). At most 2: one is the answer, two says that --tenant is needed. $1 key
SELECT tenant FROM oncegate_effects WHERE key = $1 ORDER BY tenant LIMIT 2
