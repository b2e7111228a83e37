-- Settles the settings a pass runs with, under the manager's lock (migration 00029): the fleet's, in
-- oncegate_partition_settings. $1 this manager's settings, $2 its gateway, $3 the seconds within which a
-- gateway's heartbeat counts it alive, $4 the floor a takeover keeps (Manager.floor) or NULL for the
-- fleet's settings now. The first manager's settings become the fleet's; a manager whose own differ takes
-- the fleet's over only when no gateway alive runs with them (a rolling change is through). This manager's
-- settings go into its gateway's row at once (advertised). Returns the fleet's settings before (NULL: none
-- yet), who set them and when, how many gateways alive run with them, whether this manager's are the fleet's now, and the fleet's settings before the last takeover
-- (NULL: none) with when it was.
WITH cur AS (
    SELECT settings, set_by, set_at, was FROM oncegate_partition_settings WHERE one
), holders AS (
    SELECT count(*) AS n FROM oncegate_gateways g
    WHERE g.partition_settings = (SELECT settings FROM cur)
      AND g.last_seen > now() - make_interval(secs => $3::double precision)
      AND g.stopped_at IS NULL -- stopped gracefully (migration 00031)
), put AS (
    INSERT INTO oncegate_partition_settings AS s (one, settings, set_by, set_at)
    VALUES (true, $1, $2, now())
    ON CONFLICT (one) DO UPDATE SET settings = EXCLUDED.settings, set_by = EXCLUDED.set_by, set_at = EXCLUDED.set_at,
        -- migration 00033: what was stored under them keeps their retentions a while. $4: the longest of
        -- the old settings' and of an older takeover's still in force (Manager.settle), else the old ones.
        was = coalesce($4, s.settings)
    WHERE s.settings <> EXCLUDED.settings AND (SELECT n FROM holders) = 0
        -- Settings recorded less than a heartbeat's liveness ago may have a manager alive whose gateway's
        -- heartbeat does not say so yet (advertised, below, finds no row before the gateway's first beat).
        AND s.set_at < now() - make_interval(secs => $3::double precision)
    RETURNING settings, set_at, was
), advertised AS (
    -- This gateway's heartbeat says the same from its next beat on; its first, written as the gateway
    -- started, before the manager ran, named none, so a gateway started within a heartbeat of the fleet's
    -- first found no gateway alive with the fleet's settings and took them over (an outside test's canary).
    UPDATE oncegate_gateways SET partition_settings = $1
    WHERE id = $2 AND partition_settings IS DISTINCT FROM $1 AND stopped_at IS NULL
)
SELECT (SELECT settings FROM cur), (SELECT set_by FROM cur), (SELECT set_at FROM cur),
    (SELECT n FROM holders)::int, EXISTS (SELECT FROM put) OR (SELECT settings FROM cur) = $1,
    CASE WHEN EXISTS (SELECT FROM put) THEN (SELECT was FROM put) ELSE (SELECT was FROM cur) END,
    coalesce((SELECT set_at FROM put), (SELECT set_at FROM cur))
