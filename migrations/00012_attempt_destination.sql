-- +goose Up

-- Each delivery attempt names its effect type and its destination (the provider's: a webhook's host, the SMTP server), so that
-- the console shows each destination's success rate over the last hour, as Svix's endpoint page does; and a
-- BRIN index on started_at finds the last hour's attempts in a table of millions without a scan. Attempts
-- are appended in time order, so the BRIN's block ranges stay tight, and it costs an insert next to nothing
-- (a b-tree on started_at would cost every attempt an index entry). Attempts recorded before this migration
-- have no destination, and are counted under "(not recorded)".
ALTER TABLE oncegate_effect_attempts ADD COLUMN type text, ADD COLUMN destination text;
CREATE INDEX oncegate_effect_attempts_started ON oncegate_effect_attempts USING brin (started_at);
