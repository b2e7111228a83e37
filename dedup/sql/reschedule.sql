-- Puts a leased row back to wait $3 ms (by the database's clock), under the lease, and its effect back to $6
-- (pending). A failed attempt adds $5 = 1 to the attempts and records its error; a row handed back unattempted
-- (breaker open, shutdown) adds 0 and keeps the last error. No row comes back when the lease was lost.
-- $7: the row waits for its destination's pause, $3 being the pause's end as the gateway knew it. Should the
-- fleet's table hold no pause of the row's destination now (an operator lifted it, `oncegate destination
-- resume`, after the gateway last looked), the row is due at once instead: it must not wait out a pause that
-- is gone. A row that names no destination waits its $3.
-- $1 effect id, $2 lease token, $3 delay in ms, $4 last error or NULL to keep it, $5 attempts to add, $6 pending
WITH back AS (
    UPDATE oncegate_outbox o
    SET run_at = CASE
            WHEN $7::boolean AND o.destination IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM oncegate_destination_pauses p
                WHERE p.type = o.type AND p.destination = o.destination AND p.tenant IN ('', o.tenant)
                  AND greatest(p.until, p.held_until) > now())
            THEN now()
            ELSE now() + make_interval(secs => $3::double precision / 1000)
        END,
        lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
        -- $5 counts them (migration 00027).
        interrupted = 0
    WHERE o.effect_id = $1 AND o.lease_token = $2
    RETURNING o.effect_id, o.run_at
)
UPDATE oncegate_effects e
SET status = $6,
    attempts = e.attempts + $5,
    last_error = COALESCE($4, e.last_error),
    next_attempt_at = back.run_at,
    updated_at = now()
FROM back
WHERE e.id = $1 AND e.id = back.effect_id
RETURNING e.id
