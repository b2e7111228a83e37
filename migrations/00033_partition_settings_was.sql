-- +goose Up

-- The fleet's partition settings before the last takeover (partitions/sql/settings.sql), kept so that a
-- takeover that shortens a retention keeps what was stored under the longer one for as long as that
-- promised: a canary with a minute's retention took a fleet's 3 minutes over 20 s after the last gateway with
-- them was SIGKILLed, and dropped, in the same pass, effects delivered 85 to 95 s before (an outside test).
-- A nullable column with no default rewrites no row, on a table of one row.
ALTER TABLE oncegate_partition_settings ADD COLUMN was text;

-- +goose Down
ALTER TABLE oncegate_partition_settings DROP COLUMN was;
