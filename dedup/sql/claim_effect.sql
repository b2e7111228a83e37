-- Leases the outbox row of one effect ($1) to $2 for $3 milliseconds and marks the effect $4 (delivering),
-- whether or not the row is due yet: a client asking again for an effect that waits for a retry (the dedup
-- proxy) has it performed now. A row another holder leases, unexpired, is left alone (no row comes back); a
-- row whose lease expired is rescued, and `rescued` says that the last attempt may have reached the provider.
-- A row of a type an operator paused is not claimed either.
WITH due AS (
    SELECT effect_id, lease_expires_at IS NOT NULL AS rescued
    FROM oncegate_outbox
    WHERE effect_id = $1
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
      AND NOT EXISTS (SELECT FROM oncegate_paused_types p WHERE p.type = oncegate_outbox.type)
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE oncegate_outbox o
    SET lease_token = gen_random_uuid(),
        lease_owner = $2,
        lease_expires_at = now() + make_interval(secs => $3::double precision / 1000)
    FROM due
    WHERE o.effect_id = due.effect_id
    RETURNING o.effect_id, o.lease_token, due.rescued, o.trace
)
UPDATE oncegate_effects e
SET status = $4, updated_at = now()
FROM claimed
WHERE e.id = claimed.effect_id
RETURNING e.id, claimed.lease_token, claimed.rescued, e.tenant, e.key, e.type, e.attempts, e.created_at,
    claimed.trace, e.stable_id
