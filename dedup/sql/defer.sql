-- Hands leased rows back, unattempted and uncharged, each to wait its own delay: the rows of a claim that a
-- fleet-wide delivery limit (oncegate_rate_buckets) or a destination's pause (oncegate_destination_pauses)
-- keeps from an attempt now. Attempts and last error stay as they were. As in release.sql, a fresh row's
-- effect goes back to pending, and a rescued row keeps an expired lease and its effect stays delivering, so
-- that the claim that finally takes it still knows it was rescued (on_crash), with the name of the gateway
-- whose attempt was interrupted.
-- A row that did not name its destination (written before rows kept it, or sent back by a retry) is given
-- it, so that the next claims of a limited type go by it (claim_limited.sql) instead of taking it again
-- whenever it is due, whatever its destination's tokens.
-- A row whose wait the claims themselves keep (its destination has no token, or is paused: claim.sql and
-- claim_limited.sql leave such rows out) keeps its place, its run_at: it is claimed again before the rows
-- behind it once its destination may be called. Made due after its delay instead, it went behind the whole
-- backlog, and of gateways racing for one destination's tokens, the losers' rows were delivered up to
-- thousands of places late. Any other row (a failed take of tokens) waits its delay.
-- Rows are found by primary key and fenced by their tokens: a row whose lease was lost is left alone.
-- $1 effect ids, $2 their lease tokens, $3 whether each was rescued, $4 each one's delay in ms, $5 each
-- one's destination, paired by index; $6 pending; $7 whether each keeps its place; $8 the holder each was
-- rescued from (NULL when not known)
WITH leased AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::boolean[], $4::bigint[], $5::text[], $7::boolean[],
            $8::text[])
        AS l (effect_id, token, rescued, delay_ms, destination, keep, interrupted_owner)
), back AS (
    UPDATE oncegate_outbox o
    SET run_at = CASE WHEN leased.keep AND leased.destination IS NOT NULL THEN o.run_at
                      ELSE now() + make_interval(secs => leased.delay_ms::double precision / 1000) END,
        lease_token = NULL,
        lease_owner = CASE WHEN leased.rescued THEN leased.interrupted_owner END,
        lease_expires_at = CASE WHEN leased.rescued THEN '-infinity'::timestamptz END,
        destination = coalesce(o.destination, leased.destination)
    FROM leased
    -- = ANY: by the primary key whatever the join order (finish_batch.sql says why).
    WHERE o.effect_id = ANY ($1::bigint[]) AND o.effect_id = leased.effect_id AND o.lease_token = leased.token
    RETURNING o.effect_id, leased.delay_ms, NOT leased.rescued AS fresh
)
UPDATE oncegate_effects e
SET status = CASE WHEN back.fresh THEN $6 ELSE e.status END,
    next_attempt_at = now() + make_interval(secs => back.delay_ms::double precision / 1000),
    updated_at = now()
FROM back
WHERE e.id = ANY ($1::bigint[]) AND e.id = back.effect_id
