-- The payload of a row leased to the caller, as the client sent it; rows accepted before migration 00004
-- print their jsonb. No row comes back when the lease was lost. $1 effect id, $2 lease token
SELECT {{payload}}
FROM oncegate_effects e
JOIN oncegate_outbox o ON o.effect_id = e.id
WHERE e.id = $1 AND o.lease_token = $2
