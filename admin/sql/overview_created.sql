-- Effects created per type and minute since $1 (minute 0 is the window's first), among the ids above $2
-- (overview_window_start.sql). Asked as a second statement so that the plan sees the id, and reads the
-- window's rows by the primary key: with the bound as a subquery, the planner guessed a third of the table
-- and started parallel workers for 1,400 rows. An effect committed late with an earlier id may fall outside
-- the window: this is a chart, not a ledger.
SELECT type, floor(extract(epoch FROM created_at - $1::timestamptz) / 60)::int AS minute, count(*)
FROM oncegate_effects
WHERE id > $2 AND created_at >= $1
GROUP BY 1, 2
