-- Hands rows leased by claim.sql or claim_limited.sql back, unattempted and due at once, when what their
-- delivery needs could not be read (their payloads, or their effects). Those claims write no effect, so
-- neither does this: it must go through while the effects cannot be read (a partition locked by VACUUM FULL,
-- CLUSTER or a REINDEX, which is what failed the read), or the leases would run out and the rows be taken for
-- a crash's (on_crash). A fresh row goes back to pending, as it was; a rescued row keeps an expired lease, so
-- that the next claim still knows it was rescued, and the name of the gateway whose attempt was interrupted,
-- under which that claim logs it. release.sql is this for the dedup proxy's claims, which mark their effect
-- delivering. Rows are found by primary key and fenced by their tokens.
-- $1 effect ids, $2 their lease tokens, $3 whether each was rescued, $4 the holder each was rescued from (NULL
-- when not known), paired by index
UPDATE oncegate_outbox o
SET lease_token = NULL,
    lease_owner = CASE WHEN leased.rescued THEN leased.interrupted_owner END,
    lease_expires_at = CASE WHEN leased.rescued THEN '-infinity'::timestamptz END
FROM unnest($1::bigint[], $2::uuid[], $3::boolean[], $4::text[]) AS leased (effect_id, token, rescued, interrupted_owner)
-- = ANY: by the primary key whatever the join order (finish_batch.sql says why).
WHERE o.effect_id = ANY ($1::bigint[]) AND o.effect_id = leased.effect_id AND o.lease_token = leased.token
