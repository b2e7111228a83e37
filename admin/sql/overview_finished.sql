-- Effects that finished (delivered, failed, dead, unknown) per type, status and minute since $1, served by the
-- finished_at index.
SELECT type, status, floor(extract(epoch FROM finished_at - $1::timestamptz) / 60)::int AS minute, count(*)
FROM oncegate_effects
WHERE finished_at >= $1
GROUP BY 1, 2, 3
