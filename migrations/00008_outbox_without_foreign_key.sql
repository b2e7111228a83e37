-- +goose Up

-- An outbox row is written only by the statement that writes its effect (insert.sql, insert_batch.sql,
-- insert_leased.sql, retry.sql) and deleted by the one that records its effect's outcome, so the foreign key
-- checked nothing those statements do not already hold; but Postgres checked it row by row, with a query and
-- a row lock on the effect that the same statement had just inserted: a sixth of the cost of recording a
-- batch of effects (issue 14). The purge, the one statement that deletes effects, deletes their outbox rows
-- itself (dedup/sql/purge.sql), as the cascade did.
ALTER TABLE oncegate_outbox DROP CONSTRAINT IF EXISTS oncegate_outbox_effect_id_fkey;
