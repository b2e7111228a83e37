-- +goose NO TRANSACTION
-- +goose Up

-- A tenant's failed, dead or unknown effects, newest first: what an operator looks for in an incident
-- (`effect ls --tenant T --status failed`, the console's filters). Without it such a listing walked the
-- (status, id) index through every tenant's effects of that status, testing each one's tenant, or the tenant's
-- (tenant, id) range through all its delivered ones: beside ten million effects, a tenant with no failed
-- effect waited 260.8 ms to be shown an empty page (console BenchmarkPages), growing with the table.
-- Partial, so that it costs the insert path nothing: an effect is written pending and most end delivered,
-- and only the few that fail, die or end in doubt get an entry.
-- Built CONCURRENTLY, so that an upgrade does not stop the writes to a large table while it builds; a build
-- that failed leaves an invalid index behind, which goes first.
DROP INDEX CONCURRENTLY IF EXISTS oncegate_effects_tenant_failures;
CREATE INDEX CONCURRENTLY oncegate_effects_tenant_failures ON oncegate_effects (tenant, status, id DESC)
    WHERE status IN ('failed', 'dead', 'unknown');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS oncegate_effects_tenant_failures;
