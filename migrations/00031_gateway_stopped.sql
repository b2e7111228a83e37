-- +goose Up

-- A gateway that stops gracefully says so in its heartbeat row (stopped_at) as its stop begins, so that the
-- fleet stops counting it at once, while it drains: before, its row read as alive for three heartbeats (15 s) after it had gone. A rolling restart
-- of N gateways so counted 2N, and each new gateway warned that the fleet's pools could ask Postgres for more
-- connections than it allows; and a partition manager with new settings waited those 15 s more to take them
-- over (an outside test: 24 s after a SIGTERM, against 16 s after a SIGKILL). The row stays for the day, as a
-- killed gateway's does: `gateway ls` shows it stopped, and the types it delivered stay known. A nullable
-- column with no default rewrites no row; its brief ACCESS EXCLUSIVE lock is tried for 200 ms at a time, as
-- 00028's was, so that heartbeats queued behind it wait no longer than that.
-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR i IN 1 .. 1200 LOOP
        BEGIN
            ALTER TABLE oncegate_gateways ADD COLUMN IF NOT EXISTS stopped_at timestamptz;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.3);
        END;
    END LOOP;
    RAISE EXCEPTION 'oncegate: no lock on oncegate_gateways in 10 minutes: a transaction holds it; run the migration again';
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE oncegate_gateways DROP COLUMN stopped_at;
