-- What a fleet's pools can ask of Postgres, against what it allows: the gateways seen in the last three
-- heartbeats ($1 seconds) and the server's max_connections less the connections kept for superusers.
SELECT (SELECT count(*) FROM oncegate_gateways WHERE last_seen > now() - make_interval(secs => $1))::int AS gateways,
    current_setting('max_connections')::int AS max_connections,
    current_setting('superuser_reserved_connections')::int AS reserved
