-- A gateway that stopped gracefully says so in its heartbeat row (migration 00031): the fleet counts it gone
-- at once, not three heartbeats later. $1 its id
UPDATE oncegate_gateways SET stopped_at = now() WHERE id = $1
