-- +goose Up

-- The attempts of an effect interrupted since its last recorded outcome: a claim that rescues the row (its
-- lease ran out with no outcome recorded: its gateway died mid-delivery) counts one here, in the update that
-- leases it, and the next outcome recorded adds them to the effect's attempts. Counted by that outcome alone,
-- a rescuer killed in turn before recording anything left its own interruption uncounted: two kills in a row
-- and an effect of max_attempts 3 was called 4 times (an outside test). The outbox row, not the effect, so
-- that a claim still writes nothing but the outbox (dedup/sql/claim.sql). A constant default: Postgres adds
-- the column without rewriting the table. Its brief ACCESS EXCLUSIVE lock is tried for 200 ms at a time, as
-- 00023's were: a transaction holding the outbox (a report, a psql BEGIN left open) holds the claims queued
-- behind the ALTER for no longer than that, not for as long as it runs.
-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR i IN 1 .. 1200 LOOP
        BEGIN
            ALTER TABLE oncegate_outbox ADD COLUMN IF NOT EXISTS interrupted integer NOT NULL DEFAULT 0;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.3);
        END;
    END LOOP;
    RAISE EXCEPTION 'oncegate: no lock on oncegate_outbox in 10 minutes: a transaction holds it; run the migration again';
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE oncegate_outbox DROP COLUMN IF EXISTS interrupted;
