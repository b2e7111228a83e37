-- +goose Up

-- The web console (issue 16): operators log in with a token, and a search box finds an effect by trace id.

-- An operator's token: only its SHA-256 is kept, so a database dump gives no way in. The role is the most the
-- token's holder may do (admin.Role). A revoked token, and every session made with it, stops working at once.
CREATE TABLE oncegate_operator_tokens (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL,
    role       text        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    hash       bytea       NOT NULL UNIQUE,
    created_by text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_used  timestamptz,
    revoked_at timestamptz
);

-- A console session, made at login: again only the SHA-256 of the cookie's value is kept. It ends at
-- expires_at, at logout, or with its token.
CREATE TABLE oncegate_console_sessions (
    hash       bytea       PRIMARY KEY,
    token_id   bigint      NOT NULL REFERENCES oncegate_operator_tokens (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX oncegate_console_sessions_expiry ON oncegate_console_sessions (expires_at);

-- The console's search box finds the effects of one trace (a trace id pasted from Jaeger or a log line).
-- Partial: effects created without a trace context cost the index nothing.
CREATE INDEX oncegate_effects_trace ON oncegate_effects (trace_id) WHERE trace_id IS NOT NULL;
