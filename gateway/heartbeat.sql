-- A gateway's heartbeat: its row in oncegate_gateways, with its circuit breakers, inserted at start and
-- refreshed every heartbeat. Rows of gateways not seen for a day are deleted on the way, so the table holds
-- the fleet of the last day, and so are the destinations' per-minute counts older than a day, pauses that
-- ended over an hour ago and delivery-limit buckets unused for a day. $1 id (the dispatcher's owner name), $2 address, $3 version, $4 started at,
-- $5 breakers (JSON array of outbox.BreakerState), $6 the effect types it delivers, $7 the requests each
-- tenant holds open in it (JSON object), $8 the partition settings it runs with (NULL: it manages none;
-- migration 00029)
WITH gone AS (
    DELETE FROM oncegate_gateways WHERE last_seen < now() - interval '1 day' AND id <> $1
), old_minutes AS (
    -- The destinations' per-minute rollup keeps a day, for the console's last hour and a margin.
    DELETE FROM oncegate_destination_minutes WHERE minute < now() - interval '1 day'
), old_pauses AS (
    -- A destination's pause ended over an hour ago: nothing reads it any more (the console shows live ones).
    -- One that holds its rows until a probe's answer (migration 00030) and ended over a day ago with no row
    -- left to probe (no gateway delivers its type any more) is gone too.
    DELETE FROM oncegate_destination_pauses p
    WHERE greatest(p.until, p.held_until) < now() - interval '1 hour'
       OR (p.until < now() - interval '1 day' AND NOT EXISTS (
            SELECT FROM oncegate_outbox o
            WHERE o.type = p.type AND o.destination = p.destination AND (p.tenant = '' OR o.tenant = p.tenant)))
), old_buckets AS (
    -- A bucket untouched for a day is full again whatever its tat says: deleting it changes no limit, and
    -- a webhook type's thousand passing hosts leave no rows behind.
    DELETE FROM oncegate_rate_buckets WHERE updated_at < now() - interval '1 day'
)
INSERT INTO oncegate_gateways AS g (id, address, version, started_at, last_seen, breakers, types, held,
    partition_settings)
VALUES ($1, $2, $3, $4, now(), $5::jsonb, $6::text[], $7::jsonb, $8)
ON CONFLICT (id) DO UPDATE SET address = EXCLUDED.address, version = EXCLUDED.version, last_seen = now(),
    breakers = EXCLUDED.breakers, types = EXCLUDED.types, held = EXCLUDED.held,
    partition_settings = EXCLUDED.partition_settings
