-- What waits to be delivered, per type: the outbox rows (one per undelivered effect) and the oldest due.
SELECT type, count(*), min(run_at) FILTER (WHERE run_at <= now()), now()
FROM oncegate_outbox GROUP BY type
