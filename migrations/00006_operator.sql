-- +goose Up

-- What an operator needs to answer "what happened to this effect, and why" without reading logs (issue 15).

-- The job that created an effect (Oncegate-Job-Id and -Epoch of the creating request) and the trace id of
-- that request, and an operator's resolution of an `unknown` effect. Nullable columns change only the
-- catalogue: no table rewrite.
ALTER TABLE oncegate_effects
    ADD COLUMN job_id            text,
    ADD COLUMN job_epoch         bigint,
    ADD COLUMN trace_id          text,
    ADD COLUMN resolution        text CHECK (resolution IN ('delivered', 'failed', 'resend')),
    ADD COLUMN resolved_by       text,
    ADD COLUMN resolved_at       timestamptz,
    ADD COLUMN resolution_reason text;

-- The operator's filters page newest first (id DESC) under keyset pagination, so each has an index that
-- serves the page without sorting: by status (dead, unknown), by type, by key prefix (text_pattern_ops: LIKE
-- 'p%' whatever the database's collation), and the effects of one job.
CREATE INDEX oncegate_effects_status ON oncegate_effects (status, id DESC);
CREATE INDEX oncegate_effects_type ON oncegate_effects (type, status, id DESC);
CREATE INDEX oncegate_effects_key_prefix ON oncegate_effects (key text_pattern_ops);
CREATE INDEX oncegate_effects_job ON oncegate_effects (job_id) WHERE job_id IS NOT NULL;

-- The replays an effect absorbed: how many, when the last came and from which job epoch (a stale worker
-- shows up as a last_replay_epoch below the effect's job_epoch). A narrow table of its own rather than
-- columns of oncegate_effects: gateways add their counts in batches (dedup.ReplayLog), and an update of a
-- wide row with seven indexes cost replays about a tenth of their rate in gatewaybench, where this one, on a
-- row whose only index is its key and with room left in its page (fillfactor), is a HOT update.
CREATE TABLE oncegate_effect_replays (
    effect_id         bigint      PRIMARY KEY REFERENCES oncegate_effects (id) ON DELETE CASCADE,
    replays           bigint      NOT NULL,
    last_replay_at    timestamptz NOT NULL,
    last_replay_epoch bigint
) WITH (fillfactor = 70);

-- Every delivery attempt of an effect, as the gateway that made it saw it. Deleted with its effect.
-- outcome: delivered, failed, retry, in_doubt (the provider's answer), or interrupted (the gateway holding the
-- lease died or lost it before recording an outcome: written by the gateway that rescued the row, naming the
-- one that held it).
CREATE TABLE oncegate_effect_attempts (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    effect_id   bigint      NOT NULL REFERENCES oncegate_effects (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    gateway     text        NOT NULL,
    lease_token uuid,
    outcome     text        NOT NULL,
    error       text,
    latency_ms  double precision
);
CREATE INDEX oncegate_effect_attempts_effect ON oncegate_effect_attempts (effect_id, id);

-- One row per running gateway, written every few seconds: what it is, and its circuit breakers, so one
-- query shows every breaker of the fleet. A gateway that stops being seen is gone (killed or stopped).
CREATE TABLE oncegate_gateways (
    id         text        PRIMARY KEY,
    address    text        NOT NULL DEFAULT '',
    version    text        NOT NULL DEFAULT '',
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL,
    breakers   jsonb       NOT NULL DEFAULT '[]'
);

-- Effect types whose delivery an operator paused: no dispatcher claims their rows, which wait, uncharged,
-- until the type is resumed (its row deleted).
CREATE TABLE oncegate_paused_types (
    type      text        PRIMARY KEY,
    paused_by text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    reason    text        NOT NULL
);

-- Every operator action: who, when, what, on how many, with which filter, why, and how it ended.
-- Append-only: a trigger refuses UPDATE, DELETE and TRUNCATE, so the log cannot be edited through the
-- gateway's own role (a superuser can still drop the trigger: that is a database administrator's act).
CREATE TABLE oncegate_audit (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,
    role    text        NOT NULL,
    action  text        NOT NULL,
    target  text        NOT NULL DEFAULT '',
    count   bigint      NOT NULL DEFAULT 0,
    filter  jsonb,
    reason  text        NOT NULL DEFAULT '',
    outcome text        NOT NULL DEFAULT 'done'
);

-- +goose StatementBegin
CREATE FUNCTION oncegate_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'oncegate_audit is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd
CREATE TRIGGER oncegate_audit_no_update BEFORE UPDATE OR DELETE ON oncegate_audit
    FOR EACH ROW EXECUTE FUNCTION oncegate_audit_append_only();
CREATE TRIGGER oncegate_audit_no_truncate BEFORE TRUNCATE ON oncegate_audit
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_audit_append_only();
