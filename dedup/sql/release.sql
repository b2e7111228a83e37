-- Hands leased rows back, unattempted and due at once, when their payloads could not be read. A fresh row
-- ($1 tokens) goes back to pending, as it was; a rescued row ($2 tokens) keeps an expired lease and its
-- effect stays delivering, as they were, so that the next claim still knows it was rescued (on_crash).
-- $3 pending
WITH back AS (
    UPDATE oncegate_outbox
    SET lease_token = NULL, lease_owner = NULL,
        lease_expires_at = CASE WHEN lease_token = ANY ($2::uuid[]) THEN '-infinity'::timestamptz END
    WHERE lease_token = ANY ($1::uuid[]) OR lease_token = ANY ($2::uuid[])
    RETURNING effect_id, lease_expires_at IS NULL AS fresh
)
UPDATE oncegate_effects e
SET status = $3, updated_at = now()
FROM back
WHERE e.id = back.effect_id AND back.fresh
