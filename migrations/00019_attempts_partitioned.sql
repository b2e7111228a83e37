-- +goose NO TRANSACTION
-- +goose Up

-- The attempt log goes into time partitions (issue 30, phase 2a): oncegate_effect_attempts becomes a table
-- partitioned by RANGE (started_at), whose partitions the gateway's partition manager (package partitions)
-- creates ahead and retires by DETACH PARTITION ... CONCURRENTLY and DROP TABLE, instead of the rows going
-- one by one with their effect.
--
-- Its foreign key to oncegate_effects goes: a partition of effects dropped later must not cascade through
-- it, and a cascade is the row-by-row delete this replaces. The purge deletes effects and leaves their
-- attempts, which go with their own partition; every reader of attempts comes to them from an effect, by
-- its id (admin/sql/attempts_list.sql, the interrupted count of effect_columns.sql), so an attempt whose
-- effect is gone is never shown. The attempt log's insert still skips an attempt whose effect is gone.
--
-- The upgrade is online and resumable: it runs outside a transaction, in steps that each commit and that
-- look at the catalogue before they act, so a gateway killed half way through runs the rest at its next
-- start. None holds a lock on oncegate_effects beyond a catalogue change, and none scans a table under a
-- lock that stops writes: the old table is kept whole as the first partition, covering everything before
-- a bound (MINVALUE to the start of the day after tomorrow, UTC), and ATTACH PARTITION skips its scan of
-- the old rows because a CHECK constraint already proves them in range. That constraint is added NOT VALID
-- (a catalogue change) and validated apart, a scan that takes SHARE UPDATE EXCLUSIVE, which lets attempts
-- be written meanwhile. The bound is in the future so that attempts written between the steps (started_at
-- = now()) still satisfy the constraint; the partition manager starts its partitions there.

-- Step 1: the foreign key goes, and the old table gets its bound, unchecked.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effect_attempts'::regclass) = 'r' THEN
        ALTER TABLE oncegate_effect_attempts DROP CONSTRAINT IF EXISTS oncegate_effect_attempts_effect_id_fkey;
        IF NOT EXISTS (SELECT FROM pg_constraint WHERE conname = 'oncegate_effect_attempts_legacy_bound'
                       AND conrelid = 'oncegate_effect_attempts'::regclass) THEN
            EXECUTE format('ALTER TABLE oncegate_effect_attempts ADD CONSTRAINT oncegate_effect_attempts_legacy_bound '
                || 'CHECK (started_at < %L) NOT VALID',
                (date_trunc('day', now() AT TIME ZONE 'UTC') + interval '2 days') AT TIME ZONE 'UTC');
        END IF;
    END IF;
END
$$;
-- +goose StatementEnd

-- Step 2: the bound is checked on the old rows, while attempts go on being written.
-- +goose StatementBegin
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effect_attempts'::regclass) = 'r' THEN
        ALTER TABLE oncegate_effect_attempts VALIDATE CONSTRAINT oncegate_effect_attempts_legacy_bound;
    END IF;
END
$$;
-- +goose StatementEnd

-- Step 3, in one transaction (a DO block is one statement): the old table is renamed, the partitioned one
-- created under the old name, and the old one attached as its first partition. Writers name the table, so
-- gateways of the previous version go on writing attempts, now into the partitioned table.
-- +goose StatementBegin
DO $$
DECLARE
    bound timestamptz;
    next_id bigint;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'oncegate_effect_attempts'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    SET LOCAL lock_timeout = '10s';
    LOCK TABLE oncegate_effect_attempts IN ACCESS EXCLUSIVE MODE;
    bound := substring(pg_get_constraintdef((SELECT oid FROM pg_constraint
        WHERE conname = 'oncegate_effect_attempts_legacy_bound'
        AND conrelid = 'oncegate_effect_attempts'::regclass)) FROM '''([^'']+)''')::timestamptz;
    -- The partitioned table's ids go on from the old table's.
    next_id := coalesce((SELECT last_value + 1 FROM pg_sequences
        WHERE schemaname = current_schema() AND sequencename = 'oncegate_effect_attempts_id_seq'), 1);
    ALTER TABLE oncegate_effect_attempts RENAME TO oncegate_effect_attempts_legacy;
    ALTER INDEX oncegate_effect_attempts_pkey RENAME TO oncegate_effect_attempts_legacy_pkey;
    ALTER INDEX oncegate_effect_attempts_effect RENAME TO oncegate_effect_attempts_legacy_effect;
    ALTER SEQUENCE oncegate_effect_attempts_id_seq RENAME TO oncegate_effect_attempts_legacy_id_seq;

    -- No primary key: a unique index of a partitioned table must include started_at, nothing refers to an
    -- attempt by its id, and a primary key the old table lacks would be built, whole, by the ATTACH below.
    -- Attempts are read by effect (effect_id, id), the index the old table has, which ATTACH takes over.
    CREATE TABLE oncegate_effect_attempts (
        id          bigint      GENERATED ALWAYS AS IDENTITY,
        effect_id   bigint      NOT NULL,
        attempt     integer     NOT NULL,
        started_at  timestamptz NOT NULL,
        gateway     text        NOT NULL,
        lease_token uuid,
        outcome     text        NOT NULL,
        error       text,
        latency_ms  double precision,
        type        text,
        destination text
    ) PARTITION BY RANGE (started_at);
    EXECUTE format('ALTER TABLE oncegate_effect_attempts ALTER COLUMN id RESTART WITH %s', next_id);
    CREATE INDEX oncegate_effect_attempts_effect ON oncegate_effect_attempts (effect_id, id);
    EXECUTE format('ALTER TABLE oncegate_effect_attempts ATTACH PARTITION oncegate_effect_attempts_legacy '
        || 'FOR VALUES FROM (MINVALUE) TO (%L)', bound);
END
$$;
-- +goose StatementEnd
