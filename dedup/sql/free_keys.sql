-- Frees the keys that point at effects of a partition of oncegate_effects about to be retired, a batch of the
-- partition's effects at a time ($1: the last id done, $2: the batch's size): each key still pointing at its
-- effect is deleted, and can be claimed anew as a new key. A key claimed again since points at its new
-- effect and stays. A key stays, and says so (the partition is kept), when its expiry has not passed (a
-- retention made shorter since it was claimed), or when its effect is on its way again (an outbox row: an
-- operator retried it) or finished less than $3 ms ago (retried and delivered since the partition was found
-- past retention): a request under it must still find its effect. NULL is the expiry of keys backfilled by
-- migration 00018: they were held until their effect went, and now it does.
--
-- The outbox is probed by its primary key, effect by effect (OFFSET 0 keeps Postgres from planning the EXISTS
-- as a hashed read of the whole outbox: 40-70 ms a batch beside 100,000 outbox rows, most of what freeing
-- keys cost in `scripts/bench retention`).
-- Each key is found by its primary key, row by row (OFFSET 0 keeps the lateral subquery from being flattened
-- into a join that might hash the whole keys table), and deleted by its row's address, without a lock taken
-- first: a lock is a WAL record of its own, and took half of the 112 bytes each freed key cost. A create
-- re-claiming the key before the delete moves it to a new effect with an expiry ahead; the delete then finds
-- the row's newer version and checks it again (READ COMMITTED), and `expires_at < now()` no longer holds, so
-- the re-claimed key stays. A create re-claiming it after the delete waits for the delete's transaction,
-- then finds the key gone and inserts it anew. Returns the batch's last id (NULL: the partition is done),
-- whether a key still held was found, and how many keys were freed.
WITH batch AS (
    SELECT id, tenant, key,
        finished_at >= now() - make_interval(secs => $3::double precision / 1000)
            OR EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = {{partition}}.id OFFSET 0) AS in_use
    FROM {{partition}} WHERE id > $1 ORDER BY id LIMIT $2
), found AS (
    SELECT k.row, k.expires_at >= now() OR b.in_use AS held
    FROM batch b
    CROSS JOIN LATERAL (
        SELECT ctid AS row, expires_at FROM oncegate_keys
        WHERE tenant = b.tenant AND key = b.key AND effect_id = b.id
        OFFSET 0
    ) k
), freed AS (
    DELETE FROM oncegate_keys WHERE ctid = ANY (ARRAY(SELECT row FROM found WHERE held IS NOT TRUE))
        AND (expires_at IS NULL OR expires_at < now())
    RETURNING 1
)
SELECT (SELECT max(id) FROM batch), EXISTS (SELECT FROM found WHERE held), (SELECT count(*) FROM freed)
