-- +goose Up

-- A payload is kept as the client sent it: json stores the text it was given (after checking that it is
-- JSON), where jsonb stores a parsed form and prints it anew on every read. That print is what a delivery
-- used to send, and it could be far larger than what was accepted: jsonb keeps 1e300 as a numeric and prints
-- its 301 digits, 1e131071 as 131,072, so a 74 KB payload read back as over 1 GB, and every claim of its type
-- failed (issue 12). Text as sent is delivered byte for byte, in the client's member order and spelling.
--
-- Rows accepted before this migration keep their jsonb in legacy_payload, and readers take
-- COALESCE(payload, legacy_payload::json). Renaming and adding a nullable column change only the catalogue:
-- no table rewrite, no long lock, and no conversion that a row written before the request checks could make
-- fail. Legacy rows leave by delivery and retention; a later migration can drop the column.
ALTER TABLE oncegate_effects RENAME COLUMN payload TO legacy_payload;
ALTER TABLE oncegate_effects ALTER COLUMN legacy_payload DROP NOT NULL;
ALTER TABLE oncegate_effects ADD COLUMN payload json;
-- Every row has exactly one of the two. Existing rows all have legacy_payload, so NOT VALID skips a scan
-- that could only succeed; new rows are checked.
ALTER TABLE oncegate_effects ADD CONSTRAINT oncegate_effects_one_payload
    CHECK (num_nonnulls(payload, legacy_payload) = 1) NOT VALID;
