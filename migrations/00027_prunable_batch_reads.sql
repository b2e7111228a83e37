-- +goose Up

-- The batch statements' reads, narrowed to the partitions that can hold their answers before they run (issue
-- 32, after 00026 did it for a request alone). insert_batch.sql and get_batch.sql read each row's effect by
-- the id its key points at, found row by row as the statement runs: Postgres 15 can leave out at run time
-- the partitions a row does not need, but it opens every partition's index scan first, at every batch,
-- whether any key of the batch was used before or not. Bounding the same read by the lowest and highest id
-- the batch's keys point at, two STABLE calls on the statement's parameters, lets it prune as the executor
-- starts: a batch of new keys opens no partition of the effects (both bounds NULL), a batch of replays those
-- its effects are in.
--
-- As 00026's: PL/pgSQL (its plan kept for the session), read with the calling statement's snapshot, the
-- tables named through the caller's search_path, the caller's rights. Each bound is one probe of the keys'
-- primary key for each row of the batch.

-- The lowest (p_highest false) or highest id of the effects that the batch's keys (tenants and keys side by
-- side) point at, or NULL when none is stored.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION oncegate_keys_effect_bound(p_tenants text[], p_keys text[], p_highest boolean)
RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    -- Key by key, each a probe of the primary key whatever the table's size when the plan was made (a join
    -- planned while the keys were few read them all).
    IF p_highest THEN
        RETURN (SELECT max((SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = i.tenant AND k.key = i.key))
                FROM unnest(p_tenants, p_keys) AS i (tenant, key));
    END IF;
    RETURN (SELECT min((SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = i.tenant AND k.key = i.key))
            FROM unnest(p_tenants, p_keys) AS i (tenant, key));
END
$$;
-- +goose StatementEnd

-- Granted as 00026's functions are: to every role that reads the effects.
-- +goose StatementBegin
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'oncegate_effects' AND privilege_type = 'SELECT'
                 AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'oncegate_effects'::regclass)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION oncegate_keys_effect_bound(text[], text[], boolean) TO %s',
            CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS oncegate_keys_effect_bound(text[], text[], boolean);
