-- +goose Up

-- A key is kept at least its retention after its effect is terminal (SPEC §2), not only its retention after
-- the effect's creation (oncegate_keys.expires_at). The two differ for an effect retried past its key's
-- expiry, a receiver down longer than retention.keys: its key was held while it was retried, and free the
-- moment it was delivered, so that a job run again just after made a second effect, delivered again under a
-- new stable id (an outside test: 40 webhooks for 20 actions). The statements that claim keys ask this
-- function only of a key whose expiry has passed and whose effect has no outbox row: the re-claim's path,
-- never a replay's. The retirement of partitions already kept an effect, and its key, retention after it
-- finished (free_keys.sql, keep_effects.sql).
--
-- STABLE PL/pgSQL, as migration 00026's functions: the effect is found by its id as a parameter, so only the
-- partition holding it is opened, and the plan is kept for the session.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_finished_within(p_effect_id bigint, p_within interval) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM oncegate_effects e WHERE e.id = p_effect_id AND e.finished_at >= now() - p_within);
END
$$;
-- +goose StatementEnd

-- Whoever may create effects may call it, as migration 00026 grants its functions to the effects' readers,
-- in case the owner's default privileges revoke EXECUTE from PUBLIC.
-- +goose StatementBegin
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'oncegate_keys' AND privilege_type = 'INSERT'
                 AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'oncegate_keys'::regclass)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION oncegate_finished_within(bigint, interval) TO %s',
            CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS oncegate_finished_within(bigint, interval);
