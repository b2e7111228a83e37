-- Frees a key that points at an effect no longer stored: $1 tenant, $2 key. Nothing this version does leaves
-- one (a partition's keys are freed before it goes), but a gateway of a version before migration 00018 left
-- running beside this one purges effects row by row, by its own retention, and its delete trigger covers
-- only the effects made before the upgrade: their keys would be held for ever (a NULL or future expiry), and
-- every request under them fail, with nothing to answer. Such a key is what the purge would have freed. A key
-- claimed by a create in flight is not seen here (its row commits with its effect), and a key whose effect
-- has an outbox row is kept.
DELETE FROM oncegate_keys k
WHERE k.tenant = $1 AND k.key = $2
    AND NOT EXISTS (SELECT FROM oncegate_effects e WHERE e.id = k.effect_id AND e.id = oncegate_key_effect($1, $2))
    -- OFFSET 0: a probe by the key's effect, never a join that reads the whole outbox (free_keys.sql's).
    AND NOT EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
