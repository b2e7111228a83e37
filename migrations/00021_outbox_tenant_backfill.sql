-- +goose Up

-- Outbox rows written before 00016 name no tenant. A claim finds them by a walk of its own, which asks each
-- row's effect for its tenant and stops after a few claims' worth of rows (dedup/sql/claim.sql): walked
-- whole, it cost 856 ms a claim beside 100,000 such rows whenever the claim skipped a tenant at its share;
-- stopped, it let one tenant's old backlog hold another tenant's old rows back (an outside test: 10 rows
-- waited 28.9 s behind 120 of a tenant at its share, half the slots idle). Named here, they are claimed
-- tenant by tenant like every other row. The outbox holds only rows still to deliver, and every writer has
-- named the tenant since 00016, so this touches those few: one statement, whose row locks a claim skips
-- (SKIP LOCKED) and an outcome waits out. A gateway of a version before 00016 still running in a rolling
-- upgrade writes rows without a tenant until it stops; they are claimed by the walk, as before.
UPDATE oncegate_outbox o
SET tenant = e.tenant
FROM oncegate_effects e
WHERE o.tenant IS NULL AND e.id = o.effect_id;

-- +goose Down
-- The tenants named stay: every version since 00016 reads them.
SELECT 1;
