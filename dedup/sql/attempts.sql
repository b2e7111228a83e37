-- Records delivery attempts (AttemptLog), many in one statement. The arrays hold one attempt per index:
-- $1 effect ids, $2 attempt numbers, $3 start times, $4 gateways, $5 lease tokens (NULL: not known),
-- $6 outcomes, $7 errors (NULL: none), $8 latencies in ms (NULL: no call was made), $9 destinations (NULL: not known), $10 effect types (NULL: not known). An attempt whose effect was
-- purged meanwhile is skipped: the attempts go with their effect.
INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, lease_token, outcome, error, latency_ms,
    type, destination)
SELECT a.effect_id, a.attempt, a.started_at, a.gateway, a.lease_token, a.outcome, a.error, a.latency_ms,
    a.type, a.destination
FROM unnest($1::bigint[], $2::int[], $3::timestamptz[], $4::text[], $5::uuid[], $6::text[], $7::text[],
            $8::double precision[], $9::text[], $10::text[])
    AS a (effect_id, attempt, started_at, gateway, lease_token, outcome, error, latency_ms, destination, type)
WHERE EXISTS (SELECT 1 FROM oncegate_effects e WHERE e.id = a.effect_id OFFSET 0)
ORDER BY a.started_at
