-- +goose Up

-- The effect types each gateway delivers, written with its heartbeat: with them an operator's `type pause`
-- refuses a type that no gateway knows (a misspelt one was paused, exit 0, and nothing was paused for real),
-- and `type ls` lists every type, not only the paused ones. And the requests each tenant holds open in it
-- (waits, proxied waiters, slow bodies: gateway/held.go) at its last heartbeat, for the console and `gateway
-- ls`. Adding a column with a constant default rewrites nothing.
ALTER TABLE oncegate_gateways ADD COLUMN types text[] NOT NULL DEFAULT '{}',
    ADD COLUMN held jsonb NOT NULL DEFAULT '{}';

