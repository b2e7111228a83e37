-- The effect types, found by a loose index scan over (type, status, id): one index probe per type, however
-- many effects there are (a DISTINCT would read them all).
WITH RECURSIVE t AS (
    (SELECT type FROM oncegate_effects ORDER BY type LIMIT 1)
    UNION ALL
    SELECT (SELECT e.type FROM oncegate_effects e WHERE e.type > t.type ORDER BY e.type LIMIT 1)
    FROM t WHERE t.type IS NOT NULL
)
SELECT type FROM t WHERE type IS NOT NULL
