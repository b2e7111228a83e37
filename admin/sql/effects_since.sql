-- The lowest id an effect created at or after $1 can have, for a listing or a count filtered by creation time
-- (`--since`): the filter then reads ids from there up, through whichever index serves the rest of it, instead
-- of walking every older effect that matches the rest (a tenant's unknown effects, all of them) to test each
-- one's created_at, which has no index of its own (the insert path stays as it is): 555 ms for
-- `effect ls --since 1h --status unknown` beside ten million effects, growing with the table.
--
-- A binary search over the primary key, each probe the first effect at or after an id: about 24 probes for
-- ten million effects, 32 for three billion, in one statement. It needs created_at to grow with id, and it
-- does up to the length of the transaction that created an effect (created_at is when it began, the id is
-- taken when the row is written): effects are written by statements bounded by the gateway's database
-- timeout, seconds, so searching for a minute before $1 finds an id below every effect created at or after
-- $1. The caller keeps its created_at >= $1, which makes the result exact. Ids purged away are skipped by the
-- probes. 0 when there are no effects.
WITH RECURSIVE search (lo, hi) AS (
    SELECT COALESCE((SELECT min(id) FROM oncegate_effects), 0),
           COALESCE((SELECT max(id) FROM oncegate_effects), -1) + 1
  UNION ALL
    SELECT CASE WHEN probe.created_at < $1::timestamptz - interval '1 minute' THEN probe.id + 1 ELSE s.lo END,
           CASE WHEN probe.created_at < $1::timestamptz - interval '1 minute' THEN s.hi ELSE (s.lo + s.hi) / 2 END
    FROM search s
    CROSS JOIN LATERAL (SELECT id, created_at FROM oncegate_effects
                        WHERE id >= (s.lo + s.hi) / 2 ORDER BY id LIMIT 1) probe
    WHERE s.lo < s.hi
)
SELECT max(lo) FROM search
