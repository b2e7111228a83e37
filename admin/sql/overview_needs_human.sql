-- How many effects are dead and how many unknown, each counted up to $1 (the status index serves both; a
-- console shows "10000+" rather than count a million rows on every refresh).
SELECT (SELECT count(*) FROM (SELECT 1 FROM oncegate_effects WHERE status = 'dead' LIMIT $1) d),
       (SELECT count(*) FROM (SELECT 1 FROM oncegate_effects WHERE status = 'unknown' LIMIT $1) u)
