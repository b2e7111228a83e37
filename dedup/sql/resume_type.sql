-- Resumes delivery of an effect type and wakes the dispatchers. Returns whether it was paused.
-- $1 type, $2 the outbox channel
WITH del AS (
    DELETE FROM oncegate_paused_types WHERE type = $1 RETURNING type
)
SELECT count(*) > 0 FROM del, LATERAL (SELECT pg_notify($2::text, $1)) n
