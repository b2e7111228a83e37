-- +goose Up

-- A row per gateway and slot that a replay rewrites when the database replicates synchronously: the write's
-- commit waits for a synchronous standby to flush the WAL up to it, so everything committed before it (the
-- effect being replayed, among it) is on the standby once it returns. Without it, an effect whose first
-- request was answered 503 because its commit's wait for the standby outlasted timeouts.database (Postgres
-- then commits locally, unreplicated) was acknowledged by the retry's replay, and lost in a failover (an
-- outside tester: 15 of 629). Slots let concurrent replays of one gateway run their barriers side by side.
CREATE TABLE oncegate_durability_barrier (
    gateway text        NOT NULL,
    slot    integer     NOT NULL,
    at      timestamptz NOT NULL,
    PRIMARY KEY (gateway, slot)
);
