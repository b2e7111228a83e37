-- +goose Up

-- Each outbox row names its effect's tenant, indexed with the type and due time, so that a claim goes round
-- the tenants with work (dedup/sql/claim.sql) instead of taking the oldest rows of whoever has most: one
-- tenant's backlog of 100,000 effects no longer stands in front of another tenant's new effects of the same
-- type (issue 31). The index is read tenant by tenant, a probe each, to find the tenants with rows; a claim
-- updates lease columns only, which no index holds, so claims stay heap-only updates. NULL for rows written
-- before this: they are claimed as one tenant of their own until they are gone.
ALTER TABLE oncegate_outbox ADD COLUMN tenant text;
CREATE INDEX oncegate_outbox_tenant_due ON oncegate_outbox (type, tenant, run_at);
