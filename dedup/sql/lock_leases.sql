-- Locks the outbox rows of many leases that are still held, in the transaction that will record their
-- outcomes together with a TxProvider's effects: until it commits, no claim can take them (claims skip locked
-- rows) and no other write can change them, so a lease found held here is still held at the commit. A row
-- whose lease was lost is not returned, and its effect must not be written in this transaction.
-- $1 effect ids, $2 lease tokens (uuid text), paired by index.
-- Row by row, in effect id order (so that two transactions never wait on each other's rows), each row
-- reached through the primary key whatever the table's size when the plan was made.
SELECT o.effect_id
FROM (SELECT * FROM unnest($1::bigint[], $2::text[]) AS l (effect_id, token) ORDER BY effect_id) l
CROSS JOIN LATERAL (
    SELECT o.effect_id FROM oncegate_outbox o
    WHERE o.effect_id = l.effect_id AND o.lease_token = l.token::uuid
    FOR UPDATE
) o
