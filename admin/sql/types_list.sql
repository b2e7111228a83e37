-- Every effect type an operator may name: the types of the gateways seen within the last day (their
-- heartbeat writes them), the types effects have (a loose index scan over (type, status, id): one probe a
-- type), and the paused ones; with each its pause, and how many gateways alive ($1 seconds) deliver it.
WITH RECURSIVE t AS (
    (SELECT type FROM oncegate_effects ORDER BY type LIMIT 1)
    UNION ALL
    SELECT (SELECT e.type FROM oncegate_effects e WHERE e.type > t.type ORDER BY e.type LIMIT 1)
    FROM t WHERE t.type IS NOT NULL
), known AS (
    SELECT type FROM t WHERE type IS NOT NULL
    UNION
    SELECT unnest(types) FROM oncegate_gateways
    UNION
    SELECT type FROM oncegate_paused_types
)
SELECT k.type, p.paused_by, p.paused_at, p.reason,
    (SELECT count(*) FROM oncegate_gateways g
     WHERE k.type = ANY (g.types) AND g.last_seen > now() - make_interval(secs => $1)
       AND g.stopped_at IS NULL)::int AS gateways
FROM known k
LEFT JOIN oncegate_paused_types p ON p.type = k.type
ORDER BY k.type
