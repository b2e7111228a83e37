-- An effect's status as it is reported, in place of the stored column. A claim (claim.sql) leases outbox rows
-- and writes nothing to their effects: rewriting each effect's row as `delivering` cost a new version of the
-- row and an entry in each of its indexes, for every delivery (issue 14). So a stored `pending` whose outbox
-- row is leased (leased.sql) is `delivering`; a stored `delivering` (written by the dedup proxy's claims, and
-- by gateways before this) always has its row leased, and reads as stored, like every other status.
CASE WHEN status = 'pending' AND {{leased}} THEN 'delivering' ELSE status END AS status
