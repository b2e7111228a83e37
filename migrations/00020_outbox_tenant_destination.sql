-- +goose NO TRANSACTION
-- +goose Up

-- A limited type's claim (dedup/sql/claim_limited.sql) reads a tenant's rows by destination when the oldest of
-- them are held back (their destination is paused or has no token): walking past a held-back backlog of
-- 100,000 rows in due order cost every claim 60 to 80 ms, and the other destinations' rows waited for it. With
-- this index the claim finds the tenant's destinations by a loose scan, a probe each, and each open one's
-- oldest rows by a range of it: 1 to 2 ms beside the same backlog.
-- Built CONCURRENTLY, so that an upgrade does not stop the writes to a large outbox while it builds; a build
-- that failed leaves an invalid index behind, which goes first.
DROP INDEX CONCURRENTLY IF EXISTS oncegate_outbox_tenant_destination_due;
CREATE INDEX CONCURRENTLY oncegate_outbox_tenant_destination_due ON oncegate_outbox (type, tenant, destination, run_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS oncegate_outbox_tenant_destination_due;
