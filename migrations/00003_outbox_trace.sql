-- +goose Up

-- The W3C trace context of the request that created the effect, so that its delivery, in whichever gateway
-- and however much later, continues the same trace.
ALTER TABLE oncegate_outbox ADD COLUMN trace jsonb;
