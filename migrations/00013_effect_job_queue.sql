-- +goose Up

-- The queue of the job that created an effect (Oncegate-Job-Queue, which the Go client's ForJob sends beside
-- the job's ID and epoch), so that an operator goes from an effect to its job without guessing the queue.
-- NULL for effects no job asked for, for effects from before, and from clients that do not send it.
ALTER TABLE oncegate_effects ADD COLUMN job_queue text;
