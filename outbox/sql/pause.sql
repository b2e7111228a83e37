-- Pauses destination $2 of effect type $1 for tenant $6 ('' for every tenant: a row that names none) for every
-- gateway, for $3 ms from now by the database's clock: it answered $4 (429 or 503) with a Retry-After to that
-- tenant's delivery. Another tenant's rows to the destination go on (migration 00028). A later answer never
-- shortens a pause another gateway set, so that a destination that said "an hour" to one call is not called
-- again a second later by another.
-- Past the pause's end its rows stay held (held_until 'infinity', migration 00030) until one gateway's probe
-- finds the destination ready (probe.go), an operator lifts the pause, or no row is left to probe.
-- $7, when not NULL, is the token of the probe that got this answer: the destination's latest word, which
-- sets the next pause whatever its length, and frees the probe.
-- $5 the gateway whose attempt got the answer
INSERT INTO oncegate_destination_pauses AS p (type, destination, tenant, until, held_until, status, paused_by,
    paused_at)
VALUES ($1, $2, $6, now() + make_interval(secs => $3::double precision / 1000), 'infinity', $4, $5, now())
ON CONFLICT (type, destination, tenant) DO UPDATE
SET until = CASE WHEN p.probe_token = $7::uuid THEN EXCLUDED.until ELSE greatest(p.until, EXCLUDED.until) END,
    held_until = 'infinity',
    status = CASE WHEN EXCLUDED.until > p.until OR p.probe_token = $7::uuid THEN EXCLUDED.status ELSE p.status END,
    paused_by = CASE WHEN EXCLUDED.until > p.until OR p.probe_token = $7::uuid THEN EXCLUDED.paused_by
        ELSE p.paused_by END,
    paused_at = CASE WHEN EXCLUDED.until > p.until OR p.probe_token = $7::uuid THEN EXCLUDED.paused_at
        ELSE p.paused_at END,
    probe_token = CASE WHEN p.probe_token = $7::uuid THEN NULL ELSE p.probe_token END,
    probe_lease = CASE WHEN p.probe_token = $7::uuid THEN NULL ELSE p.probe_lease END,
    prober = CASE WHEN p.probe_token = $7::uuid THEN NULL ELSE p.prober END
