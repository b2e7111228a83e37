-- Ends probe $4 of the pause of destination $2 of effect type $1 for tenant $3 (claim_probe.sql). $5 true: the
-- destination answered without asking to wait, and the pause is lifted, its rows free for every gateway's
-- claim, which the notification on channel $6 wakes (a row comes back); false: the probe made no call (a
-- breaker refused it, the gateway stopped), and is freed for the next probe at once. A pause whose probe is no
-- longer $4 (its lease ran out and another gateway took it, an operator lifted the pause) is left alone.
WITH lifted AS (
    DELETE FROM oncegate_destination_pauses p
    WHERE $5::boolean AND p.type = $1 AND p.destination = $2 AND p.tenant = $3 AND p.probe_token = $4
    RETURNING 1
), freed AS (
    UPDATE oncegate_destination_pauses p
    SET probe_token = NULL, probe_lease = NULL, prober = NULL
    WHERE NOT $5::boolean AND p.type = $1 AND p.destination = $2 AND p.tenant = $3 AND p.probe_token = $4
)
SELECT true FROM lifted, LATERAL (SELECT pg_notify($6::text, $1)) n
