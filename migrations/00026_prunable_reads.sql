-- +goose Up

-- Reads that Postgres can narrow to one partition before it runs them (issue 32). A statement that finds an
-- effect by the id its key points at, computed in the statement (`id = (SELECT k.effect_id ...)`), cannot
-- leave partitions out until it runs: Postgres 15 prunes as the executor starts only by parameters and
-- stable expressions. So it opened an index scan on every partition of the effects, at every run, whether
-- the key was new or not; and a body read by a subquery of the effect's row (columns.sql) did the same on
-- every partition of the bodies. Over 39 daily partitions, the statement that records a request alone cost
-- Postgres about 1 ms of CPU, against 0.3 ms with these functions.
--
-- Each is STABLE: called with the statement's parameters, it is evaluated as the executor starts, and only
-- the partition holding its answer is opened; it reads with the calling statement's snapshot, so it sees the
-- key as the statement's other reads do. PL/pgSQL, not SQL: a SQL function's query would be planned again at
-- each call, a PL/pgSQL one keeps its plan for the session. They name tables as the statements do, through
-- the caller's search_path, and run with the caller's rights.

-- The effect the tenant's key points at (oncegate_keys), or NULL.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_key_effect(p_tenant text, p_key text) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = p_tenant AND k.key = p_key);
END
$$;
-- +goose StatementEnd

-- The stored answer of an effect whose body is kept apart (migration 00025), or NULL.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_body_result(p_effect_id bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT b.result FROM oncegate_effect_bodies b WHERE b.effect_id = p_effect_id);
END
$$;
-- +goose StatementEnd

-- Whether an effect's body kept apart is still there (its partition not yet retired).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_body_kept(p_effect_id bigint) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM oncegate_effect_bodies b WHERE b.effect_id = p_effect_id);
END
$$;
-- +goose StatementEnd

-- A role that reads the effects can call them. EXECUTE goes to PUBLIC by default, but not where the owner's
-- default privileges revoke it (ALTER DEFAULT PRIVILEGES ... REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC): a
-- read-only role would then lose reads by key that it had. Granted as migration 00025 copies the effects'
-- grants to the bodies.
-- +goose StatementBegin
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'oncegate_effects' AND privilege_type = 'SELECT'
                 AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'oncegate_effects'::regclass)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION oncegate_key_effect(text, text), oncegate_body_result(bigint), '
            || 'oncegate_body_kept(bigint) TO %s',
            CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS oncegate_body_kept(bigint);
DROP FUNCTION IF EXISTS oncegate_body_result(bigint);
DROP FUNCTION IF EXISTS oncegate_key_effect(text, text);
