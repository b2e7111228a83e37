-- +goose Up

-- Every effect a tenant asked for, under its idempotency key. The unique constraint on (tenant, key) is what
-- turns a retried or re-run request into a replay: of concurrent inserts with one key, exactly one wins.
CREATE TABLE oncegate_effects (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant          text        NOT NULL,
    key             text        NOT NULL,
    type            text        NOT NULL,
    -- SHA-256 of the canonical JSON of {type, payload}: the same key with another request is refused.
    fingerprint     bytea       NOT NULL,
    payload         jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivering', 'delivered', 'failed', 'dead', 'unknown')),
    attempts        integer     NOT NULL DEFAULT 0,
    result          jsonb,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    next_attempt_at timestamptz,
    -- When the effect became terminal; retention counts from here.
    finished_at     timestamptz,
    CONSTRAINT oncegate_effects_tenant_key UNIQUE (tenant, key)
);

CREATE INDEX oncegate_effects_page ON oncegate_effects (tenant, id DESC);
CREATE INDEX oncegate_effects_finished ON oncegate_effects (finished_at) WHERE finished_at IS NOT NULL;

-- The transactional outbox: a row exists while its effect still has to be delivered. It is inserted in the
-- same transaction as the effect, so an accepted effect is never without one, and deleted in the transaction
-- that records the effect's terminal outcome.
CREATE TABLE oncegate_outbox (
    effect_id        bigint      PRIMARY KEY REFERENCES oncegate_effects (id) ON DELETE CASCADE,
    type             text        NOT NULL,
    run_at           timestamptz NOT NULL DEFAULT now(),
    -- A dispatcher's lease: only the holder of lease_token may record the outcome (fencing). A row whose lease
    -- expired was being delivered when its gateway died, and is rescued by another.
    lease_token      uuid,
    lease_owner      text,
    lease_expires_at timestamptz
);

CREATE INDEX oncegate_outbox_due ON oncegate_outbox (type, run_at);

-- The analytics table of the `postgres` provider's default configuration. The insert and the effect's
-- "delivered" mark commit in one transaction; the unique constraint makes a second insert impossible.
CREATE TABLE analytics_events (
    id          bigserial   PRIMARY KEY,
    tenant      text        NOT NULL,
    key         text        NOT NULL,
    name        text        NOT NULL,
    properties  jsonb,
    occurred_at timestamptz,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, key)
);
