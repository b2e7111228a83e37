-- Reads the effects that many (tenant, key) pairs point at now (oncegate_keys), at once: the requests of a
-- batch whose keys were taken already are answered from what this returns. $1 tenants, $2 keys, paired by
-- index. Key by key (LATERAL ... LIMIT 1), so that the plan probes the indexes however small the tables were
-- when it was made. The arrays reach unnest through a subquery kept apart (OFFSET 0), so that custom plans do
-- not know the batch's size and Postgres settles on the generic plan (as in insert_batch.sql).
SELECT stored.*
FROM (SELECT $1::text[], $2::text[] OFFSET 0) a (tenants, keys)
CROSS JOIN LATERAL unnest(a.tenants, a.keys) AS i (tenant, key)
CROSS JOIN LATERAL (
    SELECT {{columns}} FROM oncegate_effects e
    WHERE e.id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = i.tenant AND k.key = i.key)
        AND e.tenant = i.tenant
    LIMIT 1
) stored
