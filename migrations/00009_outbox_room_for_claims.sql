-- +goose Up

-- A claim (dedup/sql/claim.sql) rewrites an outbox row's lease and nothing else, and no index holds the lease:
-- with room in the row's page, Postgres writes the new version beside the old as a heap-only tuple and neither
-- index (the key, and `oncegate_outbox_due`) gets an entry for it. Inserted back to back, the pages were full,
-- so every claim added an entry to both indexes: three or four WAL records a row, where a heap-only update
-- takes two, for rows that live for seconds (issue 14). Half of each page is left for those updates; pages
-- written before this keep their layout until their rows are gone, which for a queue is soon. The change takes
-- a lock that blocks neither reads nor writes.
ALTER TABLE oncegate_outbox SET (fillfactor = 50);
