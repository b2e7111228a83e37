-- +goose Up

-- Fleet-wide delivery limits per effect type and destination (issue 31). Every gateway that shares the
-- database takes its tokens from the same row, so N gateways hold one limit, not N, and a gateway that dies
-- holds none back: there are no per-gateway shares to hand over.
--
-- A bucket is kept as GCRA's theoretical arrival time (`tat`): a destination limited to r a second with a
-- burst of b may take n more calls at t when max(tat, t) + n/r <= t + b/r, and tat then moves on by n/r. One
-- timestamp a row, written with INSERT … ON CONFLICT DO UPDATE, which locks the row and computes the new tat
-- from its latest committed version, so concurrent takes from several gateways never grant the same token.
-- `granted` is what the last take got (RETURNING cannot see the old row); `per_second` and `burst` are the
-- limit that take applied, and `taken` counts every token granted, so the console and CLI read the limit and
-- the current rate without asking a gateway.
CREATE TABLE oncegate_rate_buckets (
    type        text             NOT NULL,
    destination text             NOT NULL,
    tat         timestamptz      NOT NULL,
    granted     integer          NOT NULL,
    per_second  double precision NOT NULL,
    burst       integer          NOT NULL,
    taken       bigint           NOT NULL DEFAULT 0,
    updated_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (type, destination)
);

-- Each outbox row names its destination (providers.Destination of its payload, written with the effect), so
-- that a claim of a limited type leaves alone the rows of a destination that has no token or is paused, and
-- takes no more rows of one destination than its tokens: without it, one destination's backlog filled every
-- claim, and rows of the type's other destinations waited behind it (convoy#1926). NULL for rows written
-- before this, or sent back by a retry: such rows count as one destination of their own. Adding a nullable
-- column rewrites no row.
ALTER TABLE oncegate_outbox ADD COLUMN destination text;

-- A destination that answered 429 or 503 with Retry-After is paused for every gateway until `until`: its
-- rows wait uncharged and no gateway calls it meanwhile. A row per effect type and destination, so that two
-- types that reach one host with two accounts (two API keys, two limits) pause apart.
CREATE TABLE oncegate_destination_pauses (
    type        text        NOT NULL,
    destination text        NOT NULL,
    until       timestamptz NOT NULL,
    status      integer     NOT NULL, -- the HTTP status that asked for it
    paused_by   text        NOT NULL, -- the gateway whose attempt got that answer
    paused_at   timestamptz NOT NULL,
    PRIMARY KEY (type, destination)
);
