-- +goose Up

-- A destination's pause ends with one call, not with all of its rows at once (issue 31). The end of a pause
-- released every row that waited for it in the same instant: an outside test saw 7 calls within 5 ms when
-- the pause ran out, and 10 of 31 rows charged an attempt by a receiver that still throttled. Now, once
-- `until` has passed, the rows stay held until `held_until` while one gateway's call of one of them (the
-- probe, leased by `probe_token` until `probe_lease`, by `prober`) asks the destination whether it is ready:
-- an answer that does not ask to wait again lifts the pause (the row goes), one that does sets the next.
-- A gateway that takes the probe and dies leaves it to the next one once `probe_lease` has passed; should no
-- gateway take it (every gateway older than this migration), the rows go at `held_until`, as before but
-- later. NULL held_until (a pause an older gateway wrote): `until` holds the rows, as it did.
-- A small table: its brief ACCESS EXCLUSIVE lock is tried for 200 ms at a time, as 00028's was.
-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('lock_timeout', '200ms', true);
    FOR i IN 1 .. 1200 LOOP
        BEGIN
            ALTER TABLE oncegate_destination_pauses
                ADD COLUMN IF NOT EXISTS held_until  timestamptz,
                ADD COLUMN IF NOT EXISTS probe_token uuid,
                ADD COLUMN IF NOT EXISTS probe_lease timestamptz,
                ADD COLUMN IF NOT EXISTS prober      text;
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
ALTER TABLE oncegate_destination_pauses DROP COLUMN held_until, DROP COLUMN probe_token, DROP COLUMN probe_lease,
    DROP COLUMN prober;
