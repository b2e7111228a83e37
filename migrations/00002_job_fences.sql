-- +goose Up

-- The highest lease epoch of each queue job that asked for effects. A worker that lost its job's lease to a
-- successor (a higher epoch) is refused new effects: fencing, end to end, from the queue to the gateway.
CREATE TABLE oncegate_job_fences (
    tenant     text        NOT NULL,
    job_id     text        NOT NULL,
    epoch      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, job_id)
);
