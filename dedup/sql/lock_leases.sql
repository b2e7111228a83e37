-- Locks the outbox rows of many leases that are still held, in the transaction that will record their
-- outcomes together with a TxProvider's effects: until it commits, no claim can take them (claims skip locked
-- rows) and no other write can change them, so a lease found held here is still held at the commit. A row
-- whose lease was lost is not returned, and its effect must not be written in this transaction.
-- $1 effect ids, $2 lease tokens (uuid text), paired by index.
SELECT o.effect_id
FROM oncegate_outbox o
JOIN unnest($1::bigint[], $2::text[]) AS l (effect_id, token)
    ON o.effect_id = l.effect_id AND o.lease_token = l.token::uuid
ORDER BY o.effect_id
FOR UPDATE OF o
