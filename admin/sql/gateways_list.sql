-- The gateways seen within the last day, newest start first, with their breakers and held requests, when
-- they stopped gracefully (migration 00031), and the database's clock to judge liveness by.
SELECT id, address, version, started_at, last_seen, breakers::text, held::text, now(), stopped_at
FROM oncegate_gateways
ORDER BY started_at DESC, id
