-- Reads the effects that many (tenant, key) pairs point at now (oncegate_keys), at once: the requests of a
-- batch whose keys were taken already are answered from what this returns. $1 tenants, $2 keys, paired by
-- index. Key by key (a subquery per key), so that the plan probes the index however small the table was when
-- it was made. The arrays reach unnest through a subquery kept apart (OFFSET 0), so that custom plans do
-- not know the batch's size and Postgres settles on the generic plan (as in insert_batch.sql).
-- The effects are read in one scan, by their ids, bounded by the lowest and highest id the batch's keys point
-- at (migration 00027), which Postgres knows as the statement starts: it opens only the partitions of effects
-- between them (none when no key is stored). A key read by a probe of its own, each (a subquery per element).
SELECT {{columns}} FROM oncegate_effects e
WHERE e.id = ANY (ARRAY(
        SELECT (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = i.tenant AND k.key = i.key)
        FROM (SELECT $1::text[], $2::text[] OFFSET 0) a (tenants, keys)
        CROSS JOIN LATERAL unnest(a.tenants, a.keys) AS i (tenant, key)))
    AND e.tenant = ANY ($1::text[])
    AND e.id >= oncegate_keys_effect_bound($1, $2, false) AND e.id <= oncegate_keys_effect_bound($1, $2, true)
