-- +goose NO TRANSACTION
-- +goose Up

-- Idempotency keys get a narrow table of their own, and it alone holds their uniqueness (issue 30). The unique
-- constraint on oncegate_effects (tenant, key) made a key free only when retention deleted its effect, so the
-- effects table could never be split by time (a unique constraint on a partitioned table must include the
-- partition key) and retention had to be a row-by-row DELETE. Now a create claims its key here, in the
-- statement that writes the effect (dedup/sql/insert.sql): the key names the effect it currently points at,
-- and a key whose expiry has passed and whose effect is terminal is claimed again by the same statement, for a
-- new effect under a new id and a new stable id. The old effect stays readable by its id until the purge
-- deletes it. Every reader of an effect by (tenant, key) goes through this table to the effect's id, so a
-- later oncegate_effects partitioned by time is read by id, and uniqueness never depends on it.
--
-- tenant leads the primary key, as Citus requires of a table distributed by tenant.
--
-- expires_at is when the key may be claimed again (once its effect is terminal): created + retention.keys,
-- counted from the creation, as Stripe counts its 24 hours. NULL is "not yet known": the keys backfilled here
-- from effects created before this migration, whose gateway's configured retention this SQL cannot know. A
-- NULL expiry is never past, so such a key is held, exactly as before, until the purge deletes its effect
-- (retention after the effect finished), and then it is free.
-- The upgrade is online and resumable, as 00019's and 00023's: gateways of the previous version go on
-- creating, replaying and purging effects through its long part, the copy of every stored key, and only its
-- last step (dropping the old constraint, which their creates name) needs them gone. Each step commits and
-- looks at the catalogue first, so a migration killed anywhere is run again and carries on:
--   1. the keys table, with its primary key (empty: no build), and a table that records the copy's progress;
--   2. triggers on oncegate_effects, installed under a lock that waits for every write in flight: an effect
--      created from then on writes its key as it is inserted, and one deleted (the previous version's purge)
--      takes its key with it; the highest id at that moment is where the copy stops;
--   3. the copy, 5,000 effects a transaction in id order, each batch's effects locked FOR KEY SHARE so that a
--      purge cannot delete one between its read and its key's commit (a key would be left pointing at
--      nothing); progress is in oncegate_keys_backfill (copied, of total) and in the gateway's log;
--   4. the old constraint dropped, and the insert trigger and the progress table, under a lock taken
--      patiently. From then on a create of the previous version fails (its ON CONFLICT names the constraint):
--      an error, nothing recorded, which its worker retries against a gateway of this version. The delete
--      trigger stays on this table (after 00023, the partition of effects made before it), so that a purge by
--      a gateway of the previous version not yet stopped still takes the effect's key with it; on a database
--      with no effect (a new one) it goes too.
-- An effect created before step 2 cannot be missed (step 2's lock waits for its transaction, and the copy
-- reads it), one created after cannot either (its trigger), and both writing its key is one row (ON
-- CONFLICT DO NOTHING: the old constraint still holds one effect per key).
CREATE TABLE IF NOT EXISTS oncegate_keys (
    tenant      text        NOT NULL,
    key         text        NOT NULL,
    effect_id   bigint      NOT NULL,
    -- The fingerprint of the effect's request (as oncegate_effects.fingerprint), kept with the key so that a
    -- reused key can be told from a replay once effect data has its own, shorter retention (phase 2).
    fingerprint bytea       NOT NULL,
    expires_at  timestamptz,
    CONSTRAINT oncegate_keys_pkey PRIMARY KEY (tenant, key)
);

-- The copy's progress: effects with an id up to last_id have their key; it is done at until_id (the highest
-- id when the triggers went in). Gone once the migration is.
CREATE TABLE IF NOT EXISTS oncegate_keys_backfill (
    last_id    bigint      NOT NULL,
    until_id   bigint      NOT NULL,
    copied     bigint      NOT NULL,
    total      bigint      NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_keys_follow_effects() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
        VALUES (NEW.tenant, NEW.key, NEW.id, NEW.fingerprint, NULL) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM oncegate_keys WHERE tenant = OLD.tenant AND key = OLD.key AND effect_id = OLD.id;
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- A statement that needs a lock writers would queue behind, tried with a lock_timeout of 200 ms, again after a
-- pause, for up to 10 minutes: a reader holding the table (a report, pg_dump, a psql BEGIN left open) then
-- holds writes off for 200 ms at a time, not for as long as it reads. The lock stays held until the calling
-- statement's transaction ends. (00023 defines it again, the same.)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_patiently(stmt text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR i IN 1 .. 1200 LOOP
        BEGIN
            EXECUTE stmt;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.3);
        END;
    END LOOP;
    RAISE EXCEPTION 'oncegate: no lock for "%" in 10 minutes: a transaction holds the table; run the migration again', stmt;
END
$$;
-- +goose StatementEnd

-- Step 2, once: the triggers, and the copy's bounds read under their lock (SHARE ROW EXCLUSIVE: it waits for
-- the writes in flight, and holds new ones off for as long as it takes to read the highest id).
-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('client_connection_check_interval', '1s', false); -- see the copy's
    IF NOT EXISTS (SELECT FROM oncegate_keys_backfill)
        AND EXISTS (SELECT FROM pg_constraint WHERE conname = 'oncegate_effects_tenant_key'
                    AND conrelid = 'oncegate_effects'::regclass) THEN
        PERFORM oncegate_patiently('CREATE OR REPLACE TRIGGER oncegate_effects_keys AFTER INSERT OR DELETE '
            || 'ON oncegate_effects FOR EACH ROW EXECUTE FUNCTION oncegate_keys_follow_effects()');
        -- total: the planner's estimate, as a count would hold writes off for as long as it reads; the span of
        -- the ids where the table was never analyzed.
        INSERT INTO oncegate_keys_backfill (last_id, until_id, copied, total)
        SELECT 0, coalesce(max(id), 0), 0,
            coalesce((SELECT reltuples::bigint FROM pg_class WHERE oid = 'oncegate_effects'::regclass AND reltuples > 0),
                max(id) - min(id) + 1, 0)
        FROM oncegate_effects;
    END IF;
END
$$;
-- +goose StatementEnd

-- Step 3: the copy, a batch a transaction, from where it stopped.
-- +goose StatementBegin
DO $$
DECLARE
    b oncegate_keys_backfill;
    top bigint;
    n bigint;
    told timestamptz := clock_timestamp();
BEGIN
    -- A migrate killed stops its copy within a second: Postgres notices a client gone only when it next
    -- writes to it, and this statement, or a patient wait for a lock, would go on alone on the server, and
    -- could finish the migration with no process to record it, beside the next migrate's. For the session:
    -- Postgres arms the check as a statement starts, so each step sets it for the steps after it (step 2's
    -- arms this one), and step 4 puts it back, so that the session is left as it was found (through a
    -- transaction-pooling PgBouncer it is a server connection the next client is handed).
    PERFORM set_config('client_connection_check_interval', '1s', false);
    LOOP
        SELECT * INTO b FROM oncegate_keys_backfill;
        EXIT WHEN NOT FOUND OR b.last_id >= b.until_id;
        WITH batch AS (
            SELECT tenant, key, id, fingerprint FROM oncegate_effects
            WHERE id > b.last_id AND id <= b.until_id ORDER BY id LIMIT 5000
            FOR KEY SHARE
        ), copied AS (
            INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
            SELECT tenant, key, id, fingerprint, NULL FROM batch
            ON CONFLICT DO NOTHING
        )
        SELECT max(id), count(*) INTO top, n FROM batch;
        UPDATE oncegate_keys_backfill SET last_id = coalesce(top, until_id), copied = copied + n, updated_at = now();
        COMMIT;
        IF clock_timestamp() - told > interval '5 seconds' THEN
            told := clock_timestamp();
            RAISE NOTICE 'oncegate migration 00018: % of about % effects have their key in oncegate_keys',
                b.copied + n, b.total;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- Step 4. No reader looks effects up by (tenant, key) any more (they go through oncegate_keys), and a key
-- claimed again has two effects under it: the old one, until the purge, and the new one. `effect show KEY`
-- without a tenant, the key's LIKE search and the operator's listings use oncegate_effects_key_prefix.
-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('client_connection_check_interval', '1s', false); -- see the copy's
    IF EXISTS (SELECT FROM oncegate_keys_backfill WHERE last_id < until_id) THEN
        RAISE EXCEPTION 'oncegate migration 00018: the copy of the keys is not done; run the migration again';
    END IF;
    -- Every lock this step needs, each taken patiently, before any DDL: oncegate_patiently leaves lock_timeout
    -- at 200 ms for the rest of the transaction, so a statement after it that waited (an operator's open
    -- transaction reading the progress table) would fail the step instead of waiting its turn.
    PERFORM oncegate_patiently('LOCK TABLE oncegate_keys_backfill IN ACCESS EXCLUSIVE MODE');
    PERFORM oncegate_patiently('LOCK TABLE oncegate_effects IN ACCESS EXCLUSIVE MODE');
    ALTER TABLE oncegate_effects DROP CONSTRAINT IF EXISTS oncegate_effects_tenant_key;
    IF EXISTS (SELECT FROM oncegate_effects) THEN
        CREATE OR REPLACE TRIGGER oncegate_effects_keys AFTER DELETE ON oncegate_effects
            FOR EACH ROW EXECUTE FUNCTION oncegate_keys_follow_effects();
    ELSE
        -- A new database: no effect of an older gateway for it to follow.
        DROP TRIGGER IF EXISTS oncegate_effects_keys ON oncegate_effects;
        DROP FUNCTION IF EXISTS oncegate_keys_follow_effects();
    END IF;
    DROP TABLE oncegate_keys_backfill;
    RESET client_connection_check_interval;
END
$$;
-- +goose StatementEnd
