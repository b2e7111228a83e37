-- Hands leased rows back, unattempted and due at once, when their payloads could not be read: the rows of the
-- dedup proxy's claims (claim_effect.sql, insert_leased.sql), which mark their effect delivering (the
-- dispatcher's claims write no effect, and hand back by hand_back.sql). A fresh row
-- goes back to pending, as it was; a rescued row keeps an expired lease and its effect stays delivering, as
-- they were, so that the next claim still knows it was rescued (on_crash), with the name of the gateway whose
-- attempt was interrupted (hand_back.sql). Rows are found by primary key and fenced by their tokens (see
-- read_payloads.sql).
-- $1 effect ids, $2 their lease tokens, $3 whether each was rescued, $5 the holder each was rescued from
-- (NULL when not known), paired by index; $4 pending
WITH leased AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::boolean[], $5::text[])
        AS l (effect_id, token, rescued, interrupted_owner)
), back AS (
    UPDATE oncegate_outbox o
    SET lease_token = NULL,
        lease_owner = CASE WHEN leased.rescued THEN leased.interrupted_owner END,
        lease_expires_at = CASE WHEN leased.rescued THEN '-infinity'::timestamptz END
    FROM leased
    -- = ANY: by the primary key whatever the join order (finish_batch.sql says why).
    WHERE o.effect_id = ANY ($1::bigint[]) AND o.effect_id = leased.effect_id AND o.lease_token = leased.token
    RETURNING o.effect_id, NOT leased.rescued AS fresh
)
UPDATE oncegate_effects e
SET status = $4, updated_at = now()
FROM back
WHERE e.id = ANY ($1::bigint[]) AND e.id = back.effect_id AND back.fresh
