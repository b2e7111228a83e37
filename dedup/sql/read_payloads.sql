-- The payloads of rows leased to the caller, as the client sent them, by lease token ($1): a plain read, which
-- locks nothing, so a read that Postgres takes long to finish or fail holds up no other claim. Rows whose
-- lease was lost do not come back.
SELECT e.id, {{payload}}
FROM oncegate_outbox o
JOIN oncegate_effects e ON e.id = o.effect_id
WHERE o.lease_token = ANY ($1::uuid[])
