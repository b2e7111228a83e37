-- The payloads of rows leased to the caller, as the client sent them: $1 effect ids and $2 their lease
-- tokens, paired by index. A plain read, which locks nothing, so a read that Postgres takes long to finish or
-- fail holds up no other claim. Rows whose lease was lost do not come back. The rows are found by their
-- primary key: lease_token has no index, and a backlog of many rows made a search by token a scan of the
-- whole outbox on every claim (issue 14). A row whose body is not there (kept apart, retention.payloads, in
-- a partition detached while an operator retried it; the partition manager attaches it again) does not come
-- back either: it is claimed again once its lease ends.
-- With each payload comes what delivering it needs of its effect (as leased_effects.sql): the claim reads
-- no effect (claim.sql says why), and this read costs no round trip of its own.
SELECT r.id, r.payload, r.tenant, r.key, r.type, r.attempts, r.created_at, r.stable_id
FROM unnest($1::bigint[], $2::uuid[]) AS l (effect_id, token)
CROSS JOIN LATERAL (
    SELECT e.id, {{payload}} AS payload, e.tenant, e.key, e.type, e.attempts, e.created_at, e.stable_id
    FROM oncegate_outbox o JOIN oncegate_effects e ON e.id = o.effect_id
    WHERE o.effect_id = l.effect_id AND o.lease_token = l.token
    LIMIT 1
) r
WHERE r.payload IS NOT NULL
