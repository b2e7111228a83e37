-- Reads the effects that many (tenant, key) pairs point at now (oncegate_keys), at once: the requests of a
-- batch whose keys were taken already are answered from what this returns. $1 tenants, $2 keys, paired by
-- index. Key by key (LATERAL ... LIMIT 1), so that the plan probes the indexes however small the tables were
-- when it was made.
SELECT stored.*
FROM unnest($1::text[], $2::text[]) AS i (tenant, key)
CROSS JOIN LATERAL (
    SELECT {{columns}} FROM oncegate_effects e
    WHERE e.id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = i.tenant AND k.key = i.key)
        AND e.tenant = i.tenant
    LIMIT 1
) stored
