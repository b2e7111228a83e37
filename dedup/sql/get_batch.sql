-- Reads the effects stored under many (tenant, key) pairs at once: the requests of a batch whose keys were
-- taken already are answered from what this returns. $1 tenants, $2 keys, paired by index. Key by key
-- (LATERAL ... LIMIT 1), so that the plan probes the index however small the table was when it was made.
SELECT stored.*
FROM unnest($1::text[], $2::text[]) AS i (tenant, key)
CROSS JOIN LATERAL (
    SELECT {{columns}} FROM oncegate_effects e WHERE e.tenant = i.tenant AND e.key = i.key LIMIT 1
) stored
