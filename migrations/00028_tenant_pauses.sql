-- +goose Up

-- A destination's pause (a 429 or 503 with Retry-After) is the tenant's whose delivery got it, for every
-- gateway: the rows of that tenant to that destination wait, and other tenants' go on. One receiver shared by
-- tenants (a chat service's incoming webhooks, limited per hook) that tells one of them to wait an hour said
-- nothing of the others, and a pause of the whole destination let one tenant stop every other's deliveries
-- there (an outside test), which SPEC's isolation forbids. tenant '' is every tenant's: a row that names no
-- tenant (written before the outbox kept it), and every pause a gateway older than this migration records.
-- Such a gateway's ON CONFLICT (type, destination) finds no constraint to match once the key includes the
-- tenant: while it runs beside newer ones, the pauses it gets are its own alone (it logs that recording one
-- failed), as the docs say. A small table: its brief ACCESS EXCLUSIVE lock is tried for 200 ms at a time, as
-- 00027's was, so that claims queued behind the ALTER wait no longer than that.
-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR i IN 1 .. 1200 LOOP
        BEGIN
            ALTER TABLE oncegate_destination_pauses ADD COLUMN IF NOT EXISTS tenant text NOT NULL DEFAULT '',
                DROP CONSTRAINT IF EXISTS oncegate_destination_pauses_pkey,
                ADD CONSTRAINT oncegate_destination_pauses_pkey PRIMARY KEY (type, destination, tenant);
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.3);
        END;
    END LOOP;
    RAISE EXCEPTION 'oncegate: no lock on oncegate_destination_pauses in 10 minutes: a transaction holds it; run the migration again';
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    -- Every tenant's pause of a destination becomes one of the whole destination, the longest.
    DELETE FROM oncegate_destination_pauses p USING oncegate_destination_pauses q
    WHERE p.type = q.type AND p.destination = q.destination AND (p.until, p.tenant) < (q.until, q.tenant);
    ALTER TABLE oncegate_destination_pauses DROP CONSTRAINT oncegate_destination_pauses_pkey,
        DROP COLUMN tenant, ADD CONSTRAINT oncegate_destination_pauses_pkey PRIMARY KEY (type, destination);
END
$$;
-- +goose StatementEnd
