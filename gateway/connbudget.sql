-- What a fleet's pools can ask of Postgres, against what it allows: the gateways seen in the last three
-- heartbeats ($1 seconds) and the server's max_connections less the connections kept for superusers.
-- A gateway that stopped gracefully (stopped_at, migration 00031) is not counted.
SELECT (SELECT count(*) FROM oncegate_gateways
        WHERE last_seen > now() - make_interval(secs => $1) AND stopped_at IS NULL)::int AS gateways,
    current_setting('max_connections')::int AS max_connections,
    current_setting('superuser_reserved_connections')::int AS reserved
