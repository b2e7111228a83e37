-- Takes the probe of a pause whose end has passed (migration 00030): leases one row of the pause's tenant
-- ($3; '' for every tenant's pause) to destination $2 of effect type $1, to dispatcher $4 for $5 ms, and notes
-- in the pause that probe $6 of $4 is out until its lease ends. The rows stay held meanwhile (every claim
-- reads greatest(until, held_until)), and the probe's answer lifts the pause or sets the next one
-- (outbox/sql/pause.sql, probe_end.sql). One gateway takes a probe: the pause's row is locked, SKIP LOCKED,
-- and a probe whose lease is running is left alone; one whose gateway died is taken again once its lease has
-- passed.
--
-- The row is the pause's oldest that no lease holds, due now or within the second: a row handed back for the
-- pause is due at its end, give or take a jitter, and one waiting for a retry further off is not called
-- early. A rescue is left to the claims, which take a lease that ran out whatever the pause. Rows of a type
-- an operator paused are not taken.
-- When no row waits for the pause, the pause is lifted instead (`lifted`): what comes due later is paced by
-- its own due time.
--
-- Exactly one row comes back: the lease's columns, NULL when no row was taken, and `lifted`.
WITH due AS (
    SELECT 1
    FROM oncegate_destination_pauses p
    WHERE p.type = $1 AND p.destination = $2 AND p.tenant = $3
      AND p.until <= now() AND p.held_until > now()
      AND (p.probe_lease IS NULL OR p.probe_lease < now())
      AND NOT EXISTS (SELECT FROM oncegate_paused_types t WHERE t.type = $1)
    FOR UPDATE OF p SKIP LOCKED
), pick AS (
    -- By oncegate_outbox_tenant_destination_due for a tenant's pause; every tenant's walks the type's rows
    -- by due time (a pause that only rows without a tenant, or gateways older than 00028, set).
    SELECT c.effect_id FROM (
        (SELECT o.effect_id, o.run_at FROM oncegate_outbox o, due
         WHERE $3::text <> '' AND o.type = $1 AND o.tenant = $3 AND o.destination = $2
           AND o.run_at <= now() + interval '1 second' AND o.lease_expires_at IS NULL
         ORDER BY o.run_at LIMIT 1)
        UNION ALL
        (SELECT o.effect_id, o.run_at FROM oncegate_outbox o, due
         WHERE $3::text = '' AND o.type = $1 AND o.destination = $2
           AND o.run_at <= now() + interval '1 second' AND o.lease_expires_at IS NULL
         ORDER BY o.run_at LIMIT 1)
    ) c
    ORDER BY c.run_at LIMIT 1
), claimed AS (
    -- The lease is checked again under the row's lock: a claim that took the row meanwhile has it.
    UPDATE oncegate_outbox o
    SET lease_token = gen_random_uuid(),
        lease_owner = $4,
        lease_expires_at = now() + make_interval(secs => $5::double precision / 1000)
    -- By the primary key: joined to pick, a plan made on an empty outbox walked it whole.
    WHERE o.effect_id = (SELECT pick.effect_id FROM pick) AND o.lease_expires_at IS NULL
    RETURNING o.effect_id, o.lease_token, o.tenant, o.type, o.trace, o.interrupted
), taken AS (
    UPDATE oncegate_destination_pauses p
    SET probe_token = $6, prober = $4,
        probe_lease = now() + make_interval(secs => $5::double precision / 1000)
    WHERE p.type = $1 AND p.destination = $2 AND p.tenant = $3 AND EXISTS (SELECT FROM claimed)
      AND EXISTS (SELECT FROM due)
), lifted AS (
    DELETE FROM oncegate_destination_pauses p
    WHERE p.type = $1 AND p.destination = $2 AND p.tenant = $3
      AND EXISTS (SELECT FROM due) AND NOT EXISTS (SELECT FROM pick)
    RETURNING 1
)
SELECT claimed.effect_id, claimed.lease_token, claimed.tenant, claimed.type, claimed.trace, claimed.interrupted,
    EXISTS (SELECT FROM lifted)
FROM (VALUES (1)) one
LEFT JOIN claimed ON true
