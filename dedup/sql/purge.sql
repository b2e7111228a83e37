-- Retention: deletes up to $2 effects that became terminal before now - $1 ms, and the keys that still point
-- at them (oncegate_keys), which are then free. A key claimed again since points at its new effect and stays:
-- the old effect goes alone. Only terminal effects have finished_at (an operator's retry clears it), and they
-- have no outbox row: an outbox row found under one all the same goes with it, as the foreign key's cascade
-- did until migration 00008, so that no claim ever leases a row whose effect is gone. SKIP LOCKED leaves the
-- rows another gateway's purge (or an operator's retry) holds to it, so purges in several gateways share the
-- work instead of queueing on each other's locks. A key row that a concurrent create is claiming again is
-- waited for, and then left alone: by then it points at the new effect.
WITH doomed AS (
    SELECT id, tenant, key FROM oncegate_effects
    WHERE finished_at < now() - make_interval(secs => $1::double precision / 1000)
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), strays AS (
    -- = ANY: by the primary key whatever the join order (finish_batch.sql says why).
    DELETE FROM oncegate_outbox WHERE effect_id = ANY (ARRAY(SELECT id FROM doomed))
), bodies AS (
    DELETE FROM oncegate_effect_bodies WHERE effect_id = ANY (ARRAY(SELECT id FROM doomed))
), freed AS (
    DELETE FROM oncegate_keys k USING doomed
    WHERE k.tenant = doomed.tenant AND k.key = doomed.key AND k.effect_id = doomed.id
)
DELETE FROM oncegate_effects WHERE id = ANY (ARRAY(SELECT id FROM doomed))
