-- +goose NO TRANSACTION
-- +goose Up

-- Payloads and stored answers kept apart from what an effect was (issue 30, `retention.payloads`): an
-- effect's body is most of its bytes (100-200 GB a day at 100M effects), and an operator who keeps 30 days
-- of effects to see what happened, with whom and when, rarely needs a month of bodies. oncegate_effect_bodies
-- is partitioned as oncegate_effects is (by effect id, which tells its time), and the partition manager
-- retires its partitions after retention.payloads, well before the effects', by DETACH and DROP: no row is
-- rewritten to forget a body.
--
-- A gateway writes bodies here only when retention.payloads is set (then effects.payload and result stay
-- NULL); otherwise, and for every effect written before, the body stays in the effect's row, and readers take
-- the effect's own columns first, then the body's. So a fleet upgrades gateway by gateway with payloads off,
-- and turns them on once every gateway reads bodies. An effect whose payload and legacy_payload are both NULL
-- and that has no body row is an effect whose body expired.
--
-- The table has no rows yet, so creating it locks nothing of the effects. The check of migration 00004
-- (exactly one of payload and legacy_payload) no longer holds, and goes; dropping it takes the effects'
-- ACCESS EXCLUSIVE lock for a moment, taken patiently as migration 00023 took its own.

CREATE TABLE IF NOT EXISTS oncegate_effect_bodies (
    effect_id bigint NOT NULL,
    tenant text NOT NULL,
    payload json,
    result jsonb,
    PRIMARY KEY (effect_id)
) PARTITION BY RANGE (effect_id);

-- The first partition, from today's UTC midnight to the day after tomorrow's, named as the partition manager
-- names its own: an effect made after this migration has an id at or past its lower bound. Roles that could
-- read or write the effects get the same on their bodies.
-- +goose StatementBegin
DO $$
DECLARE
    lower timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    g record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_inherits WHERE inhparent = 'oncegate_effect_bodies'::regclass) THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF oncegate_effect_bodies FOR VALUES FROM (%s) TO (%s)',
            'oncegate_effect_bodies_p' || to_char(lower AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS'),
            oncegate_effect_id_at(lower), oncegate_effect_id_at(lower + interval '2 days'));
    END IF;
    FOR g IN SELECT grantee, privilege_type FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'oncegate_effects'
                 AND privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
                 AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'oncegate_effects'::regclass)
    LOOP
        EXECUTE format('GRANT %s ON oncegate_effect_bodies TO %I', g.privilege_type, g.grantee);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR i IN 1 .. 1200 LOOP
        BEGIN
            ALTER TABLE oncegate_effects DROP CONSTRAINT IF EXISTS oncegate_effects_one_payload;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.3);
        END;
    END LOOP;
    RAISE EXCEPTION 'oncegate: no lock on oncegate_effects in 10 minutes: a transaction holds it; run the migration again';
END
$$;
-- +goose StatementEnd

-- +goose Down
-- Bodies written apart are lost: turn retention.payloads off and let them expire first.
DROP TABLE IF EXISTS oncegate_effect_bodies;
