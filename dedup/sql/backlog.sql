-- Per effect type: rows in the outbox, and how long the oldest due, unleased row has waited (seconds).
SELECT type,
       count(*),
       COALESCE(EXTRACT(EPOCH FROM now() - min(run_at) FILTER (
           WHERE run_at <= now() AND (lease_expires_at IS NULL OR lease_expires_at < now()))), 0)::float8
FROM oncegate_outbox
GROUP BY type
