-- +goose Up

-- A queue job's fence, named by its queue and its enqueue, not by its ID alone. oncegate_job_fences kept one
-- highest epoch per (tenant, job ID). Epochs are a queue's own, and start low again for a new job under an
-- ID a queue's floor no longer knows: the same business ID in a second queue, a queue destroyed and made
-- again, a job enqueued again after Redis lost it. Each such job was refused (409 job-fenced) at every lease
-- below the old job's epoch, used up its attempts and went dead without its effect (an outside test: 300 of
-- 300 jobs of a queue made again). A fence is now a row per (tenant, queue, job ID), '' for a client that
-- names no queue, and its token is the pair (the job's creation in Redis, in unix milliseconds; the epoch),
-- compared in that order: a job enqueued again is later, whatever its epoch; a run of the same job is fenced
-- by its epoch as before; 0 is the creation of a client that does not send it.
--
-- A new table, so that the migration rewrites and locks nothing a gateway of the version before uses: those
-- go on fencing in oncegate_job_fences until they are replaced (a job whose runs, during a rolling upgrade, go
-- through gateways of both versions is fenced in each table apart). A later migration drops the old table.
-- Rows untouched for the keys' hold are deleted by the gateways' heartbeats (updated_at's index).
CREATE TABLE oncegate_run_fences (
    tenant     text        NOT NULL,
    queue      text        NOT NULL DEFAULT '',
    job_id     text        NOT NULL,
    created_ms bigint      NOT NULL DEFAULT 0,
    epoch      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, queue, job_id)
);
CREATE INDEX oncegate_run_fences_updated ON oncegate_run_fences (updated_at);

-- Whoever writes the old fences writes the new ones, as migration 00025 granted its table.
-- +goose StatementBegin
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT grantee, privilege_type FROM information_schema.role_table_grants
             WHERE table_schema = current_schema() AND table_name = 'oncegate_job_fences'
                 AND privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
                 AND grantee <> (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'oncegate_job_fences'::regclass)
    LOOP
        EXECUTE format('GRANT %s ON oncegate_run_fences TO %s', g.privilege_type,
            CASE WHEN g.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(g.grantee) END);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE oncegate_run_fences;
