-- Leases the outbox row of effect $1, of type $2, that this gateway has just created, to dispatcher $3 for $4
-- milliseconds. The dispatcher asks this for a tenant with nothing of the type in flight here, so that its new
-- effect does not wait for the claim loop's round, which beside another tenant's backlog is a claim of that
-- backlog's rows, 4 to 16 ms each on busy cores, and then a claim of its own (issue 31).
--
-- The row is taken only as claim.sql would take it: due, never leased, its type not paused by an operator,
-- its destination not paused by the fleet for its tenant. SKIP LOCKED: a claim of another gateway that holds the row has it.
-- One probe of the outbox's primary key; no effect is read (claim.sql says why).
--
-- Exactly one row comes back: the lease's columns (NULL when the row was not taken), and `paused`, set when
-- the row was there to take but for a pause, so that the caller can tell a pause from another claim.
WITH cur AS (
    SELECT o.effect_id,
        EXISTS (SELECT 1 FROM oncegate_paused_types p WHERE p.type = $2)
            OR EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                WHERE p.type = $2 AND p.destination = o.destination AND p.tenant IN ('', o.tenant)
                  AND greatest(p.until, p.held_until) > now()) AS paused
    FROM oncegate_outbox o
    WHERE o.effect_id = $1 AND o.type = $2
      AND o.run_at <= now()
      AND o.lease_expires_at IS NULL
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE oncegate_outbox o
    SET lease_token = gen_random_uuid(),
        lease_owner = $3,
        lease_expires_at = now() + make_interval(secs => $4::double precision / 1000)
    FROM cur
    WHERE o.effect_id = $1 AND o.effect_id = cur.effect_id AND NOT cur.paused
    RETURNING o.effect_id, o.lease_token, o.tenant, o.type, o.trace, o.interrupted
)
SELECT claimed.effect_id, claimed.lease_token, claimed.tenant, claimed.type, claimed.trace, claimed.interrupted,
    coalesce(cur.paused, false)
FROM (VALUES (1)) one
LEFT JOIN cur ON true
LEFT JOIN claimed ON true
