-- +goose Up

-- Each delivery attempt names its effect type and its destination, and each minute's attempts are counted per
-- type and destination in a narrow rollup, so that the console shows each destination's success rate and
-- latencies over the last hour, as Svix's endpoint page does, by reading 60 rows per destination rather than
-- every attempt of the hour (445 ms for half a million attempts; a busy gateway makes millions an hour). The
-- gateway that flushes its attempt log adds to the rollup in the same statement; latencies are counted in
-- fixed buckets (dedup.LatencyBuckets), from which percentiles are read as bucket bounds. Rows older than a
-- day are deleted by the gateways' heartbeats. Attempts recorded before this migration are in neither.
ALTER TABLE oncegate_effect_attempts ADD COLUMN type text, ADD COLUMN destination text;

CREATE TABLE oncegate_destination_minutes (
    minute          timestamptz NOT NULL,
    type            text        NOT NULL,
    destination     text        NOT NULL,
    attempts        bigint      NOT NULL,
    delivered       bigint      NOT NULL,
    failed          bigint      NOT NULL,
    retried         bigint      NOT NULL,
    in_doubt        bigint      NOT NULL, -- in doubt, or interrupted (the gateway died holding the lease)
    latency_buckets bigint[]    NOT NULL, -- calls per latency bucket, bounds in dedup.LatencyBuckets
    PRIMARY KEY (minute, type, destination)
);
