-- Records delivery attempts (AttemptLog), many in one statement. The arrays hold one attempt per index:
-- $1 effect ids, $2 attempt numbers, $3 start times, $4 gateways, $5 lease tokens (NULL: not known),
-- $6 outcomes, $7 errors (NULL: none), $8 latencies in ms (NULL: no call was made), $9 destinations and
-- $10 effect types (NULL: not known). An attempt whose effect was purged meanwhile is skipped: the attempts go
-- with their effect.
-- In the same statement, so that a retried flush never counts twice, the flush's attempts are added to the
-- per-minute rollup of each type and destination (oncegate_destination_minutes, which the console's
-- Destinations page reads). Its arrays hold one (minute, type, destination) per index, summed by the gateway:
-- $11 minutes, $12 types, $13 destinations, $14 attempts, $15 delivered, $16 failed, $17 retried, $18 in
-- doubt, $19 the latency buckets of every index, flattened, $20 of them per index. Several gateways add to the
-- same rows: the upsert's row locks, taken in one order, serialise them, and each adds its own counts.
WITH logged AS (
    INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, lease_token, outcome, error, latency_ms,
        type, destination)
    SELECT a.effect_id, a.attempt, a.started_at, a.gateway, a.lease_token, a.outcome, a.error, a.latency_ms,
        a.type, a.destination
    FROM unnest($1::bigint[], $2::int[], $3::timestamptz[], $4::text[], $5::uuid[], $6::text[], $7::text[],
                $8::double precision[], $9::text[], $10::text[])
        AS a (effect_id, attempt, started_at, gateway, lease_token, outcome, error, latency_ms, destination, type)
    WHERE EXISTS (SELECT 1 FROM oncegate_effects e WHERE e.id = a.effect_id OFFSET 0)
    ORDER BY a.started_at
), rolled AS (
    INSERT INTO oncegate_destination_minutes AS d (minute, type, destination, attempts, delivered, failed, retried,
        in_doubt, latency_buckets)
    SELECT r.minute, r.type, r.destination, r.attempts, r.delivered, r.failed, r.retried, r.in_doubt,
        ($19::bigint[])[(r.i - 1) * $20::int + 1 : r.i * $20::int]
    FROM unnest($11::timestamptz[], $12::text[], $13::text[], $14::bigint[], $15::bigint[], $16::bigint[],
                $17::bigint[], $18::bigint[])
        WITH ORDINALITY AS r (minute, type, destination, attempts, delivered, failed, retried, in_doubt, i)
    ORDER BY r.minute, r.type, r.destination
    ON CONFLICT (minute, type, destination) DO UPDATE
    SET attempts = d.attempts + EXCLUDED.attempts, delivered = d.delivered + EXCLUDED.delivered,
        failed = d.failed + EXCLUDED.failed, retried = d.retried + EXCLUDED.retried,
        in_doubt = d.in_doubt + EXCLUDED.in_doubt,
        latency_buckets = ARRAY(SELECT a + b FROM unnest(d.latency_buckets, EXCLUDED.latency_buckets)
                                    WITH ORDINALITY AS t (a, b, i) ORDER BY i)
)
SELECT 1
