-- +goose Up

-- The partition settings the fleet runs with: partitions.interval and .ahead, retention.keys and
-- retention.payloads, as one text (partitions.Config.Settings). A pass runs with the settings of whichever
-- gateway takes the manager's lock, and gateways with different settings took turns: an outside tester's
-- gateway started for 6 s with the default daily interval beside a fleet of 1-minute partitions made one
-- partition of 15 hours, which the fleet then filled, and another's shorter retention.payloads dropped bodies
-- the fleet's setting kept. A manager now runs a pass only with these settings; one whose own differ leaves
-- partitions alone, and says so, while a live gateway (its heartbeat, oncegate_gateways.partition_settings)
-- runs with them, and takes them over once none does: a rolling change of settings takes effect when the last
-- gateway with the old ones is gone.
CREATE TABLE oncegate_partition_settings (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    settings text        NOT NULL,
    set_by   text        NOT NULL,
    set_at   timestamptz NOT NULL
);
-- NULL: a gateway that manages no partitions (partitions.disabled), or one older than this migration.
ALTER TABLE oncegate_gateways ADD COLUMN partition_settings text;

-- +goose Down
ALTER TABLE oncegate_gateways DROP COLUMN partition_settings;
DROP TABLE oncegate_partition_settings;
