-- Lifts the pause of destination $2 of effect type $1 (a 429 or 503 with Retry-After paused it for every
-- gateway, outbox/sql/pause.sql), makes its rows that wait for a retry due now (the attempt that got the 429
-- waits for the Retry-After, others for a backoff: the operator says the receiver is back), and wakes the
-- dispatchers on the outbox channel $3, so that they are claimed at once. Returns the pause lifted (the time
-- it was to end, the status that set it, the gateway that got it: of the longest, when several tenants' are
-- lifted, migration 00028) and the rows made due; no row when the destination was not paused.
WITH lifted AS (
    DELETE FROM oncegate_destination_pauses
    WHERE type = $1 AND destination = $2 AND greatest(until, held_until) > now()
    RETURNING until, status, paused_by
), longest AS (
    SELECT * FROM lifted ORDER BY until DESC LIMIT 1
), due AS (
    UPDATE oncegate_outbox o
    SET run_at = now()
    WHERE EXISTS (SELECT FROM lifted) AND o.type = $1 AND o.destination = $2
      AND o.run_at > now()
      AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
    RETURNING o.effect_id
)
SELECT longest.until, longest.status, longest.paused_by, (SELECT count(*) FROM due)
FROM longest, LATERAL (SELECT pg_notify($3::text, $1)) n
