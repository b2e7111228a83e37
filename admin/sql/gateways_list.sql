-- The gateways seen within the last day, newest start first, with their breakers and held requests, and the
-- database's clock to judge liveness by.
SELECT id, address, version, started_at, last_seen, breakers::text, held::text, now()
FROM oncegate_gateways
ORDER BY started_at DESC, id
