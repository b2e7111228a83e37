-- A gateway stopping gracefully says so in its heartbeat row as its stop begins (migration 00031): the fleet
-- counts it gone at once, not three heartbeats later, while it finishes the deliveries in flight (a heartbeat
-- written meanwhile leaves stopped_at as it is). $1 its id
UPDATE oncegate_gateways SET stopped_at = now() WHERE id = $1
