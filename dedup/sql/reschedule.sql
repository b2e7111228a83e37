-- Puts a leased row back to wait $3 ms (by the database's clock), under the lease, and its effect back to $6
-- (pending). A failed attempt adds $5 = 1 to the attempts and records its error; a row handed back unattempted
-- (breaker open, shutdown) adds 0 and keeps the last error. No row comes back when the lease was lost.
-- $1 effect id, $2 lease token, $3 delay in ms, $4 last error or NULL to keep it, $5 attempts to add, $6 pending
WITH back AS (
    UPDATE oncegate_outbox
    SET run_at = now() + make_interval(secs => $3::double precision / 1000), lease_token = NULL, lease_owner = NULL,
        lease_expires_at = NULL
    WHERE effect_id = $1 AND lease_token = $2
    RETURNING effect_id
)
UPDATE oncegate_effects e
SET status = $6,
    attempts = e.attempts + $5,
    last_error = COALESCE($4, e.last_error),
    next_attempt_at = now() + make_interval(secs => $3::double precision / 1000),
    updated_at = now()
FROM back
WHERE e.id = back.effect_id
RETURNING e.id
