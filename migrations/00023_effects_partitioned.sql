-- +goose NO TRANSACTION
-- +goose Up

-- Effects, and their replay counters, go into time partitions (issue 30, phase 2b), so that retention drops
-- a day of effects as one table instead of deleting them row by row with their nine indexes.
--
-- They are partitioned by RANGE on the effect's id, and an effect's id now says when it was made: the
-- seconds since 2025-01-01 UTC shifted left by 22 bits, or'ed with 22 bits of a cycling sequence
-- (oncegate_next_effect_id()). A partition for [t1, t2) is the id range [id(t1), id(t2)). This keeps what
-- the id was: the primary key, by itself, unique (a unique key of a partitioned table must hold the
-- partition key, and the id is it), read with one probe of one partition (a lookup by id is pruned to the
-- partition that can hold it, where a table partitioned by created_at would probe every partition's index),
-- and growing with time, as the listings' pages and `--since` expect. 31 bits of seconds reach 2093; the id
-- stays under 2^53, exact in JavaScript's numbers. Two effects can share an id only if 4,194,304 effects
-- are made within one second, or the database's clock goes back by a second and the sequence comes round to
-- the same value meanwhile: the primary key then refuses the second insert (a 5xx the client retries),
-- never stores two effects under one id.
--
-- oncegate_effect_replays follows the same bounds (its effect_id) and loses its foreign key: a dropped
-- partition of effects must not cascade, and every reader reaches replays from an effect.
--
-- The upgrade is online and resumable, as 00019's: steps that each commit and look at the catalogue first,
-- no table scanned under a lock that stops writes. The old tables become the first partitions (_legacy),
-- covering every id before the id of the upgrade's first step, proven by CHECK constraints added NOT VALID
-- and validated apart (SHARE UPDATE EXCLUSIVE: effects go on being written), so that ATTACH skips its scan.
-- Every id drawn before the upgrade came from a sequence counting from 1, far below (an id of 2025 is over
-- 2^44). The indexes of the new tables are made on the partitioned table alone (no rows) before the ATTACH,
-- which then takes over the old table's as its partitions' instead of building any. Gateways of the previous
-- version go on working through it: they draw ids from oncegate_effects_id_seq (kept), which are small and
-- land in the legacy partition. Ids of the new form are drawn only by gateways of this version, which start
-- once the migration is done; the last step makes their first partition, from the bound to the start of the
-- day after tomorrow (UTC), so that effects can be created before a partition manager has run (it carries on
-- from there).

-- Step 0: the id's generator.
-- +goose StatementBegin
DO $$
DECLARE
    acl record;
BEGIN
    IF to_regclass('oncegate_effect_id_low') IS NULL THEN
        CREATE SEQUENCE oncegate_effect_id_low AS bigint MINVALUE 0 MAXVALUE 4194303 START 0 CYCLE;
        -- Whoever could draw the old ids can draw the new ones (an application role apart from the owner).
        FOR acl IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
                   WHERE c.oid = to_regclass('oncegate_effects_id_seq') AND a.grantee <> c.relowner LOOP
            EXECUTE format('GRANT %s ON SEQUENCE oncegate_effect_id_low TO %s', acl.privilege_type,
                CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(acl.grantee)) END);
        END LOOP;
    END IF;
END
$$;
-- +goose StatementEnd

-- A statement that needs a lock writers would queue behind (ACCESS EXCLUSIVE), tried with a lock_timeout of
-- 200 ms, again after a pause, for up to 10 minutes: a reader holding the table (a report, pg_dump, a psql
-- BEGIN left open) then holds writes off for 200 ms at a time, not for as long as it reads. A lock taken
-- stays held until the calling statement's transaction ends.
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

-- now(), as created_at's default: an effect's id tells the second of its created_at, and an effect lands in
-- the partition of the time it was made.
CREATE OR REPLACE FUNCTION oncegate_next_effect_id() RETURNS bigint
LANGUAGE sql VOLATILE
RETURN ((floor(extract(epoch FROM now()))::bigint - 1735689600) << 22) | nextval('oncegate_effect_id_low');

-- The id of an instant: the lowest id an effect made then can have. Partition bounds are these.
CREATE OR REPLACE FUNCTION oncegate_effect_id_at(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE
RETURN (floor(extract(epoch FROM t))::bigint - 1735689600) << 22;

-- Step 1: the old tables get their bound, unchecked, and replays lose their foreign key. One bound for both,
-- so that their partitions line up.
-- +goose StatementBegin
DO $$
DECLARE
    bound bigint := oncegate_effect_id_at(now());
BEGIN
    -- The foreign key first: dropping it locks both tables, and a replay's upsert holds the replays and then
    -- checks its key against the effects. Taken in this order, neither waits for the other in a circle.
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effect_replays'::regclass) = 'r'
       AND EXISTS (SELECT FROM pg_constraint WHERE conname = 'oncegate_effect_replays_effect_id_fkey') THEN
        PERFORM oncegate_patiently('ALTER TABLE oncegate_effect_replays DROP CONSTRAINT IF EXISTS '
            || 'oncegate_effect_replays_effect_id_fkey');
    END IF;
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effects'::regclass) = 'r' THEN
        IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'oncegate_effects_legacy_bound'
                       AND conrelid = 'oncegate_effects'::regclass) THEN
            PERFORM oncegate_patiently(format('ALTER TABLE oncegate_effects ADD CONSTRAINT oncegate_effects_legacy_bound '
                || 'CHECK (id < %s) NOT VALID', bound));
        END IF;
    END IF;
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effect_replays'::regclass) = 'r' THEN
        IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'oncegate_effect_replays_legacy_bound'
                       AND conrelid = 'oncegate_effect_replays'::regclass) THEN
            -- The effects' bound, when a killed upgrade already set it.
            bound := coalesce(substring(pg_get_constraintdef((SELECT oid FROM pg_constraint
                WHERE conname = 'oncegate_effects_legacy_bound')) FROM '< ''?(\d+)')::bigint, bound);
            PERFORM oncegate_patiently(format('ALTER TABLE oncegate_effect_replays ADD CONSTRAINT '
                || 'oncegate_effect_replays_legacy_bound CHECK (effect_id < %s) NOT VALID', bound));
        END IF;
    END IF;
END
$$;
-- +goose StatementEnd

-- Step 2: the bounds (and 00004's payload check) are checked on the old rows, while effects go on being
-- written.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effects'::regclass) = 'r' THEN
        ALTER TABLE oncegate_effects VALIDATE CONSTRAINT oncegate_effects_legacy_bound;
        -- 00004 added it NOT VALID (every row then had legacy_payload); a partitioned table's CHECK must be
        -- valid on the partition attached, and this scan can only succeed.
        IF EXISTS (SELECT FROM pg_constraint WHERE conname = 'oncegate_effects_one_payload'
                   AND conrelid = 'oncegate_effects'::regclass AND NOT convalidated) THEN
            ALTER TABLE oncegate_effects VALIDATE CONSTRAINT oncegate_effects_one_payload;
        END IF;
    END IF;
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effect_replays'::regclass) = 'r' THEN
        ALTER TABLE oncegate_effect_replays VALIDATE CONSTRAINT oncegate_effect_replays_legacy_bound;
    END IF;
END
$$;
-- +goose StatementEnd

-- Step 3, for each table in a transaction of its own (a statement here is one), so that it holds one table's
-- lock alone and no reader of both waits in a circle with it, taken patiently: the old table is renamed with its indexes, the
-- partitioned one created under the old name with the same columns, constraints and indexes, and the old
-- one attached as its first partition. Writers name the table, so they go on writing, now into the
-- partitioned one.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_partition_by_effect_id(t text, key text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bound text;
    idx record;
    acl record;
    defs text[];
    first text;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = t::regclass) <> 'r' THEN
        RETURN;
    END IF;
    PERFORM oncegate_patiently(format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', t));
    bound := substring(pg_get_constraintdef((SELECT oid FROM pg_constraint
        WHERE conname = t || '_legacy_bound' AND conrelid = t::regclass)) FROM '< ''?(\d+)');

    -- The definitions of its indexes but the primary key, as they read under the old name, which the
    -- partitioned table takes.
    defs := ARRAY(SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
        WHERE i.indrelid = t::regclass AND NOT i.indisprimary);
    FOR idx IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = t::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', idx.relname,
            t || '_legacy' || substr(idx.relname, length(t) + 1));
    END LOOP;
    EXECUTE format('ALTER TABLE %I RENAME TO %I', t, t || '_legacy');

    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE '
        || 'INCLUDING COMMENTS) PARTITION BY RANGE (%I)', t, t || '_legacy', key);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', t, t || '_legacy_bound');
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (%I)', t, t || '_pkey', key);
    -- The old table's grants (a read-only role for the operator's CLI, an application role apart from the
    -- owner): the partitioned table is what they name now.
    FOR acl IN SELECT a.grantee, a.privilege_type, a.is_grantable FROM pg_class c, aclexplode(c.relacl) a
               WHERE c.oid = (t || '_legacy')::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON %I TO %s%s', acl.privilege_type, t,
            CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(acl.grantee)) END,
            CASE WHEN acl.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    FOR acl IN SELECT a.attname, x.grantee, x.privilege_type, x.is_grantable
               FROM pg_attribute a, aclexplode(a.attacl) x
               WHERE a.attrelid = (t || '_legacy')::regclass AND a.attacl IS NOT NULL AND NOT a.attisdropped LOOP
        EXECUTE format('GRANT %s (%I) ON %I TO %s%s', acl.privilege_type, acl.attname, t,
            CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(acl.grantee)) END,
            CASE WHEN acl.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(defs, 1), 0) LOOP
        EXECUTE defs[i];
    END LOOP;
    IF t = 'oncegate_effects' THEN
        ALTER TABLE oncegate_effects ALTER COLUMN id SET DEFAULT oncegate_next_effect_id();
    END IF;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (MINVALUE) TO (%s)',
        t, t || '_legacy', bound);
    -- The first partition of new ids, named as the partition manager names its own (after its lower bound,
    -- UTC), with the storage parameters the old table had (replays: fillfactor).
    first := t || '_p' || to_char(to_timestamp(1735689600 + (bound::bigint >> 22)) AT TIME ZONE 'UTC',
        'YYYYMMDD"t"HH24MISS');
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s) %s', first, t, bound,
        oncegate_effect_id_at((date_trunc('day', now() AT TIME ZONE 'UTC') + interval '2 days') AT TIME ZONE 'UTC'),
        coalesce((SELECT 'WITH (' || array_to_string(reloptions, ', ') || ')' FROM pg_class
                  WHERE oid = (t || '_legacy')::regclass AND reloptions IS NOT NULL), ''));
END
$$;
-- +goose StatementEnd

SELECT oncegate_partition_by_effect_id('oncegate_effects', 'id');
SELECT oncegate_partition_by_effect_id('oncegate_effect_replays', 'effect_id');
DROP FUNCTION oncegate_partition_by_effect_id(text, text);
DROP FUNCTION oncegate_patiently(text);
