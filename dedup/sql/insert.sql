-- Records a new effect and its outbox row, claiming its key (oncegate_keys). One statement is one
-- transaction: the key, the effect and its outbox row commit, or none does.
--
-- The key is held while it has not expired (expires_at, NULL never) or its effect is not terminal (it has an
-- outbox row: the row is written with the effect and by a retry, and deleted only in the statements that make
-- the effect terminal, finish.sql, finish_batch.sql and resolve.sql) or finished less than its hold ago ($16;
-- SPEC §2; oncegate_finished_within, migration 00032, asked last, so only of a key on its way to be
-- re-claimed: an effect retried past its key's expiry keeps its key that long after it). A held key inserts
-- nothing and returns the stored effect with created false, so that a replay costs one statement and writes nothing, not even a
-- row lock (issue 14): `held` reads the key as this statement's snapshot has it, and the insert into
-- oncegate_keys then has no row to try. A free key (none, or expired with a terminal effect) is claimed by the
-- insert, which re-claims an expired key with ON CONFLICT ... DO UPDATE: the key then points at the new
-- effect, under a new id (drawn here: oncegate_next_effect_id(), which tells the time, migration 00023) and
-- a new stable id, and the old effect stays readable by its id until its partition is retired.
--
-- Of concurrent creates of one key, the primary key of oncegate_keys lets exactly one through: a second
-- waits for the first's row, and its DO UPDATE then finds the key pointing at another effect than the one
-- its snapshot saw (effect_id = held's) and leaves it alone. A key taken or re-claimed by a transaction that
-- committed after this statement's snapshot was taken returns no row at all: the caller reads it then (Get).
-- The stored effect of a held key is found by oncegate_key_effect($1, $2) (migration 00026), which reads the
-- key with this statement's snapshot, as `held` does: a stable function of the parameters, which Postgres
-- evaluates as the statement starts, so it opens the one partition of the effects that holds the effect (none
-- for a new key). `held.effect_id` is known only once the statement runs, and opened every partition.
-- The outbox is probed by its primary key, row by row (OFFSET 0 keeps Postgres from planning the EXISTS as a
-- hashed read of the whole outbox, which a plan made on empty tables would keep as the outbox grows).
-- No NOTIFY here: it would take Postgres's cluster-wide notification lock at every commit; the gateway
-- announces new effects after the commit, batched.
-- $1 tenant, $2 key, $3 type, $4 fingerprint, $5 payload, $6 trace context (W3C, as JSON) or NULL,
-- $7 the effect's stable id (effect.NewStableID), $8 the asking job's id or NULL, $9 its lease epoch or NULL,
-- $10 its tags or NULL, $11 its search terms (tags and recipients, lowercased) or NULL, $12 the job's queue
-- or NULL, $13 its destination (providers.Destination) or NULL, $14 the key's retention in milliseconds, $15
-- whether its payload goes to oncegate_effect_bodies (retention.payloads) rather than into its row, $16 the
-- key's hold after its effect finished in milliseconds (SPEC §2; the retention, or longer after a takeover).
-- The trace id, for the operator, is the one of the traceparent in $6.
WITH held AS (
    SELECT k.effect_id,
        k.expires_at IS NULL OR k.expires_at >= now()
            OR EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
            OR oncegate_finished_within(k.effect_id, make_interval(secs => $16::double precision / 1000)) AS held
    FROM oncegate_keys k
    WHERE k.tenant = $1 AND k.key = $2
), claimed AS (
    INSERT INTO oncegate_keys AS k (tenant, key, effect_id, fingerprint, expires_at)
    SELECT $1, $2, oncegate_next_effect_id(), $4,
        now() + make_interval(secs => $14::double precision / 1000)
    WHERE NOT EXISTS (SELECT FROM held WHERE held.held)
    ON CONFLICT (tenant, key) DO UPDATE
    SET effect_id = EXCLUDED.effect_id, fingerprint = EXCLUDED.fingerprint, expires_at = EXCLUDED.expires_at
    WHERE k.effect_id = (SELECT held.effect_id FROM held) AND k.expires_at < now()
        AND NOT EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
        AND NOT oncegate_finished_within(k.effect_id, make_interval(secs => $16::double precision / 1000))
    RETURNING k.effect_id
), effect AS (
    INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload, stable_id, job_id, job_epoch,
        trace_id, tags, search_terms, job_queue)
    SELECT claimed.effect_id, $1, $2, $3, $4, CASE WHEN $15::boolean THEN NULL ELSE $5::json END, $7, $8::text, $9::bigint,
        NULLIF(split_part($6::jsonb ->> 'traceparent', '-', 2), ''), $10::text[], $11::text[], $12::text
    FROM claimed
    RETURNING {{written}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, trace, destination, tenant)
    SELECT id, type, $6::jsonb, $13::text, tenant FROM effect
), bodied AS (
    INSERT INTO oncegate_effect_bodies (effect_id, tenant, payload)
    SELECT claimed.effect_id, $1, $5::json FROM claimed WHERE $15::boolean
)
SELECT true AS created, {{written}} FROM effect
UNION ALL
SELECT false, {{columns}} FROM oncegate_effects
WHERE id = oncegate_key_effect($1, $2) AND tenant = $1 AND EXISTS (SELECT FROM held WHERE held.held)
