-- Sends a notification; it is delivered when the surrounding transaction commits.
-- $1 channel (a notifier.Topic), $2 payload (under 8000 bytes)
SELECT pg_notify($1::text, $2::text)
