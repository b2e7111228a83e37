-- Adds the replays that a gateway absorbed since its last flush to their effects' counts, in one statement for
-- all of them (ReplayLog): a replay costs no write of its own. $1 effect ids, $2 how many replays each,
-- $3 when the last came, $4 the job epoch the last came with (NULL: none), paired by index. Rows are written
-- in id order, so that two gateways' flushes of the same effects queue rather than deadlock. An effect purged
-- meanwhile is skipped.
INSERT INTO oncegate_effect_replays AS r (effect_id, replays, last_replay_at, last_replay_epoch)
SELECT c.id, c.n, c.at, c.epoch
FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[], $4::bigint[]) AS c (id, n, at, epoch)
WHERE EXISTS (SELECT 1 FROM oncegate_effects e WHERE e.id = c.id OFFSET 0)
ORDER BY c.id
ON CONFLICT (effect_id) DO UPDATE
SET replays = r.replays + EXCLUDED.replays,
    last_replay_at = GREATEST(r.last_replay_at, EXCLUDED.last_replay_at),
    last_replay_epoch = CASE WHEN EXCLUDED.last_replay_at >= r.last_replay_at
                             THEN EXCLUDED.last_replay_epoch ELSE r.last_replay_epoch END
