-- Lifts the pause of destination $2 of effect type $1 (a 429 or 503 with Retry-After paused it for every
-- gateway, outbox/sql/pause.sql), makes its rows that wait for a retry due now (the attempt that got the 429
-- waits for the Retry-After, others for a backoff: the operator says the receiver is back), and wakes the
-- dispatchers on the outbox channel $3, so that they are claimed at once. Returns the pause lifted (the time
-- it was to end, the status that set it, the gateway that got it) and the rows made due; no row when the
-- destination was not paused.
WITH lifted AS (
    DELETE FROM oncegate_destination_pauses
    WHERE type = $1 AND destination = $2 AND until > now()
    RETURNING until, status, paused_by
), due AS (
    UPDATE oncegate_outbox o
    SET run_at = now()
    FROM lifted
    WHERE o.type = $1 AND o.destination = $2
      AND o.run_at > now()
      AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
    RETURNING o.effect_id
)
SELECT lifted.until, lifted.status, lifted.paused_by, (SELECT count(*) FROM due)
FROM lifted, LATERAL (SELECT pg_notify($3::text, $1)) n
