-- An effect's delivery attempts, in the order they were made. $1 effect id
-- A gateway that stood still past its lease (a paused VM, SIGSTOP) may come back and record what its call got
-- after another gateway rescued the row and logged that attempt as interrupted, under the same lease token:
-- the late record is what became of the attempt, so the interrupted row is left out, and the late one says
-- that it came after its lease (an outside test found the two side by side, both numbered 1).
SELECT a.attempt, a.started_at, a.gateway, a.destination, a.lease_token::text, a.outcome,
    CASE WHEN a.outcome <> 'interrupted' AND a.lease_token IS NOT NULL AND EXISTS (
            SELECT FROM oncegate_effect_attempts b
            WHERE b.effect_id = $1 AND b.lease_token = a.lease_token AND b.outcome = 'interrupted')
        THEN concat_ws('; ', a.error, 'recorded after its lease had run out: another gateway had rescued the row')
        ELSE a.error END,
    a.latency_ms
FROM oncegate_effect_attempts a
WHERE a.effect_id = $1
  AND NOT (a.outcome = 'interrupted' AND a.lease_token IS NOT NULL AND EXISTS (
        SELECT FROM oncegate_effect_attempts b
        WHERE b.effect_id = $1 AND b.lease_token = a.lease_token AND b.outcome <> 'interrupted'))
ORDER BY a.started_at, a.id
