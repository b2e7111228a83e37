-- Leases the outbox row of one effect ($1) to $2 for $3 milliseconds and marks the effect $4 (delivering),
-- whether or not the row is due yet: a client asking again for an effect that waits for a retry (the dedup
-- proxy) has it performed now. A row another holder leases, unexpired, is left alone; a row whose lease
-- expired is rescued, and `rescued` says that the last attempt may have reached the provider. A row of a type
-- an operator paused is not claimed either.
--
-- $5, when not NULL, fences the claim: the lease token of the attempt the caller waited for. Only that lease,
-- run out (its holder died mid-attempt), may then be taken; a row whose awaited attempt ended (handed back,
-- or leased anew) is not, because the caller is owed that attempt's answer, not an attempt of its own.
--
-- Exactly one row comes back: `claimed`; `holding`, the token of the lease on the row as it stood (NULL
-- when the row had none, or there is no row: the effect is terminal); and `paused`, set when the row would
-- have been taken but for an operator's pause of its type. The row is locked without SKIP LOCKED,
-- so `holding` is the latest committed state, never a snapshot older than a concurrent claim or outcome.
--
-- A rescue counts the interrupted attempt on the row and brings the lease it rescues from, as claim.sql's do
-- (migration 00027): the caller logs that attempt under the gateway that made it, and a holder that dies in
-- turn leaves its own to the next claim's count.
WITH cur AS (
    SELECT effect_id, lease_token, lease_expires_at IS NOT NULL AS rescued, lease_owner AS prev_owner,
        lease_expires_at AS prev_expires,
        (lease_expires_at IS NULL OR lease_expires_at < now()) AND ($5::uuid IS NULL OR lease_token = $5) AS free,
        EXISTS (SELECT FROM oncegate_paused_types p WHERE p.type = oncegate_outbox.type) AS paused
    FROM oncegate_outbox
    WHERE effect_id = $1
    FOR UPDATE OF oncegate_outbox
), claimed AS (
    UPDATE oncegate_outbox o
    SET lease_token = gen_random_uuid(),
        lease_owner = $2,
        lease_expires_at = now() + make_interval(secs => $3::double precision / 1000),
        -- As in claim.sql: a lease that ran out is an interrupted attempt; one handed back after its rescue
        -- ('-infinity') was counted by the claim that rescued it.
        interrupted = o.interrupted + CASE WHEN cur.prev_expires > '-infinity' THEN 1 ELSE 0 END
    FROM cur
    -- = $1 as well: by the primary key whatever the join order (finish_batch.sql says why).
    WHERE o.effect_id = $1 AND o.effect_id = cur.effect_id AND cur.free AND NOT cur.paused
    RETURNING o.effect_id, o.lease_token, cur.rescued, o.trace, cur.prev_owner, cur.lease_token AS prev_token,
        cur.prev_expires, o.interrupted
), won AS (
    UPDATE oncegate_effects e
    SET status = $4, updated_at = now()
    FROM claimed
    WHERE e.id = $1 AND e.id = claimed.effect_id
    RETURNING e.id, claimed.lease_token, claimed.rescued, e.tenant, e.key, e.type, e.attempts, e.created_at,
        claimed.trace, e.stable_id, claimed.prev_owner, claimed.prev_token, claimed.prev_expires,
        claimed.interrupted
)
SELECT won.id IS NOT NULL AS claimed, cur.lease_token AS holding, cur.free AND cur.paused AS paused,
    won.id, won.lease_token, won.rescued, won.tenant, won.key, won.type, won.attempts, won.created_at,
    won.trace, won.stable_id, won.prev_owner, won.prev_token, won.prev_expires, won.interrupted
FROM (VALUES (1)) one
LEFT JOIN cur ON true
LEFT JOIN won ON true
