-- Leases up to $2 due outbox rows of effect type $1 to dispatcher $3 for $4 milliseconds, in one statement, and
-- returns what delivering their effects needs. The effects' rows are read, not written: an effect whose outbox
-- row is leased reads as delivering (status.sql), and rewriting the row at every claim cost a new version of it
-- and an entry in each of its indexes (a tenth to a quarter of Postgres's CPU a delivery, issue 14).
-- SKIP LOCKED lets any number of dispatchers claim at once without waiting on each other or taking the same
-- row. A row whose lease expired is due again: its dispatcher died mid-delivery, and `rescued` tells the
-- caller that the attempt may have reached the provider.
-- Payloads are read by a statement of their own (read_payloads.sql), after these leases commit: see Claim.
-- Rows of the tenants in $5 are left alone: they have their fair share of this type's deliveries in flight.
-- A type an operator paused (oncegate_paused_types) is not claimed at all: its rows wait, uncharged.
-- A rescued row brings the lease it is rescued from (prev_owner, prev_token), so that the rescue can record
-- the interrupted attempt against the gateway that made it.
-- `paused` is the same on every row: the destinations of the type that asked every gateway to wait
-- (oncegate_destination_pauses), with the milliseconds left, by the database's clock. Rows are claimed before
-- their destinations are known (a provider reads it from the payload), so the dispatcher hands back those of
-- a paused destination, uncharged; asked here, the pause costs unlimited types no statement of their own.
WITH due AS (
    SELECT effect_id, lease_expires_at IS NOT NULL AS rescued, lease_owner AS prev_owner, lease_token AS prev_token,
        lease_expires_at AS prev_expires
    FROM oncegate_outbox
    WHERE type = $1
      AND NOT EXISTS (SELECT 1 FROM oncegate_paused_types p WHERE p.type = $1)
      AND run_at <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
      AND (cardinality($5::text[]) = 0 OR NOT EXISTS (
          SELECT 1 FROM oncegate_effects e WHERE e.id = oncegate_outbox.effect_id AND e.tenant = ANY($5::text[])))
    ORDER BY run_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE oncegate_outbox o
    SET lease_token = gen_random_uuid(),
        lease_owner = $3,
        lease_expires_at = now() + make_interval(secs => $4::double precision / 1000)
    FROM due
    WHERE o.effect_id = due.effect_id
    RETURNING o.effect_id, o.lease_token, due.rescued, o.trace, due.prev_owner, due.prev_token, due.prev_expires
)
SELECT e.id, claimed.lease_token, claimed.rescued, e.tenant, e.key, e.type, e.attempts, e.created_at,
    claimed.trace, e.stable_id, claimed.prev_owner, claimed.prev_token, claimed.prev_expires,
    (SELECT jsonb_object_agg(p.destination, ceil(extract(epoch FROM p.until - now()) * 1000)::bigint)
     FROM oncegate_destination_pauses p WHERE p.type = $1 AND p.until > now()) AS paused
FROM claimed
CROSS JOIN LATERAL (SELECT * FROM oncegate_effects e WHERE e.id = claimed.effect_id LIMIT 1) e
