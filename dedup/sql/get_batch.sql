-- Reads the effects stored under many (tenant, key) pairs at once: the requests of a batch whose keys were
-- taken already are answered from what this returns. $1 tenants, $2 keys, paired by index.
SELECT {{columns}}
FROM oncegate_effects
WHERE (tenant, key) IN (SELECT * FROM unnest($1::text[], $2::text[]))
