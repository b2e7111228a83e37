-- Records a terminal outcome (delivered, failed, dead or unknown) under the lease: the outbox row goes and
-- the effect takes its final status. No row comes back when the lease was lost, and then nothing changed.
-- Waiters are told by the dispatcher, which batches the notifications (a NOTIFY in every one of these
-- transactions would serialise their commits).
-- $1 effect id, $2 lease token, $3 status, $4 result or NULL to keep it, $5 last error, $6 attempts to add,
-- $7 whether the effect was delivered (then delivered_at is now). The answer of an effect whose body is kept
-- apart (retention.payloads: neither payload column set) goes to its row of oncegate_effect_bodies.
WITH gone AS (
    DELETE FROM oncegate_outbox
    WHERE effect_id = $1 AND lease_token = $2
    RETURNING effect_id
), answered AS (
    UPDATE oncegate_effect_bodies b
    SET result = $4::jsonb
    FROM gone
    WHERE b.effect_id = $1 AND b.effect_id = gone.effect_id AND $4::jsonb IS NOT NULL
)
UPDATE oncegate_effects e
SET status = $3,
    attempts = e.attempts + $6,
    result = CASE WHEN e.payload IS NULL AND e.legacy_payload IS NULL THEN e.result
        ELSE COALESCE($4::jsonb, e.result) END,
    last_error = $5,
    delivered_at = CASE WHEN $7::boolean THEN now() ELSE e.delivered_at END,
    next_attempt_at = NULL,
    finished_at = now(),
    updated_at = now()
FROM gone
WHERE e.id = $1 AND e.id = gone.effect_id
RETURNING e.id
