-- Effects created per type and minute since $1 (minute 0 is the window's first). The newest effects are the
-- highest ids, so the scan walks the primary key down from the top and stops at the first effect created
-- before $1: it reads the window's rows, never the table (created_at has no index of its own, so the
-- gateway's insert path stays as it was). An effect committed late with an earlier id may fall outside the
-- window: this is a chart, not a ledger.
SELECT type, floor(extract(epoch FROM created_at - $1::timestamptz) / 60)::int AS minute, count(*)
FROM oncegate_effects
WHERE id > COALESCE((SELECT id FROM oncegate_effects WHERE created_at < $1 ORDER BY id DESC LIMIT 1), 0)
  AND created_at >= $1
GROUP BY 1, 2
