-- Ends probe $4 of the pause of destination $2 of effect type $1 for tenant $3 (claim_probe.sql), as $5 says:
--   'lift': the destination answered without asking to wait (or answered a permanent failure itself): the
--     pause is lifted, its rows free for every gateway's claim, which the notification on channel $6 wakes;
--   'again': the probe got no answer it could go by (a timeout, a refused connection, a 5xx without
--     Retry-After): the destination is paused again as long as the last pause was (1 s to 1 h), as a breaker
--     whose half-open call fails opens again; the status becomes 0: no answer;
--   'free': the probe made no call (the gateway stopped, the row was not to be called): freed for the next
--     at once.
-- A pause whose probe is no longer $4 (its lease ran out and another gateway took it, an operator lifted the
-- pause) is left alone. Returns the ms the pause now lasts, NULL when it was lifted or left alone.
WITH lifted AS (
    DELETE FROM oncegate_destination_pauses p
    WHERE $5::text = 'lift' AND p.type = $1 AND p.destination = $2 AND p.tenant = $3 AND p.probe_token = $4
    RETURNING 1
), again AS (
    UPDATE oncegate_destination_pauses p
    SET until = now() + least(greatest(p.until - p.paused_at, interval '1 second'), interval '1 hour'),
        held_until = 'infinity', status = 0, paused_by = p.prober,
        paused_at = now(), probe_token = NULL, probe_lease = NULL, prober = NULL
    WHERE $5::text = 'again' AND p.type = $1 AND p.destination = $2 AND p.tenant = $3 AND p.probe_token = $4
    RETURNING ceil(extract(epoch FROM p.until - now()) * 1000)::bigint AS ms
), freed AS (
    UPDATE oncegate_destination_pauses p
    SET probe_token = NULL, probe_lease = NULL, prober = NULL
    WHERE $5::text = 'free' AND p.type = $1 AND p.destination = $2 AND p.tenant = $3 AND p.probe_token = $4
), notified AS (
    SELECT pg_notify($6::text, $1) FROM lifted
)
SELECT EXISTS (SELECT FROM lifted), (SELECT ms FROM again), (SELECT count(*) FROM notified)
