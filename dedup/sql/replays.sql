-- Adds the replays that a gateway absorbed since its last flush to their effects' counts, in one statement for
-- all of them (ReplayLog): a replay costs no write of its own. $1 effect ids, $2 how many replays each,
-- $3 when the last came, $4 the job epoch the last came with (NULL: none), paired by index. The rows are locked
-- in id order first, so that two gateways' flushes of the same effects queue rather than deadlock. An effect
-- purged meanwhile is skipped.
WITH counts AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[], $4::bigint[]) AS c (id, n, at, epoch)
), locked AS (
    SELECT e.id FROM oncegate_effects e JOIN counts USING (id) ORDER BY e.id FOR UPDATE OF e
)
UPDATE oncegate_effects e
SET replays = e.replays + counts.n,
    last_replay_at = GREATEST(e.last_replay_at, counts.at),
    last_replay_epoch = CASE WHEN e.last_replay_at IS NULL OR counts.at >= e.last_replay_at
                             THEN counts.epoch ELSE e.last_replay_epoch END
FROM counts, locked
WHERE e.id = counts.id AND locked.id = counts.id
