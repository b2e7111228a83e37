-- An effect's delivery attempts, in the order they were made. $1 effect id
SELECT attempt, started_at, gateway, destination, lease_token::text, outcome, error, latency_ms
FROM oncegate_effect_attempts
WHERE effect_id = $1
ORDER BY started_at, id
