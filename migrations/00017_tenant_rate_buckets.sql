-- +goose Up

-- Fleet-wide tenant request rates (issue 31, limits.tenant_rate.scope: fleet): a tenant's request bucket
-- held by every gateway that shares the database, not by each. Kept as GCRA's theoretical arrival time, as
-- oncegate_rate_buckets keeps a destination's (00015), but in a table of its own: a tenant is not a
-- destination, and the delivery buckets' readers (the console, `oncegate destination ls`) must not find it.
-- Gateways take tokens in batches (internal/tenantlimit's take.sql), a round trip per batch, never one per
-- request. `granted` is what the last take got; `per_second` and `burst` the rate it applied (the last
-- gateway's configuration wins while a rolling change goes round); `taken` counts every token granted.
CREATE TABLE oncegate_tenant_rate_buckets (
    tenant      text             NOT NULL PRIMARY KEY,
    tat         timestamptz      NOT NULL,
    granted     integer          NOT NULL,
    per_second  double precision NOT NULL,
    burst       integer          NOT NULL,
    taken       bigint           NOT NULL DEFAULT 0,
    updated_at  timestamptz      NOT NULL DEFAULT now()
);
