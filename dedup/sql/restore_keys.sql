-- Puts back the keys of a partition's effects that are on their way again (an outbox row: an operator retried
-- them, by key or in bulk) after the partition's keys were freed for its retirement, which then stopped: the
-- partition is kept, or attached again after its detach. Without its key, a retried effect no longer holds
-- it, and a request under the key would make a second effect while the first is being sent. The outbox rows
-- of the partition's id range ($1, $2) are read over the outbox's primary key, and each row's effect probed
-- by id in {{partition}} (attached or detached). A key taken since by a new effect (a request after the key
-- had expired) stays the new effect's. The key is put back expired: the outbox row holds it (insert.sql), and
-- once the effect is done it can be claimed anew, as before. Returns the keys put back.
WITH back AS (
    INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
    SELECT e.tenant, e.key, e.id, e.fingerprint, now()
    FROM oncegate_outbox o
    CROSS JOIN LATERAL (SELECT * FROM {{partition}} p WHERE p.id = o.effect_id OFFSET 0) e
    WHERE o.effect_id >= $1 AND o.effect_id < $2
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM back
