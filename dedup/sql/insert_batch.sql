-- Records the new effects of many concurrent requests, and their outbox rows, in one statement: one commit
-- (one WAL flush) for all of them instead of one each. The arrays hold one request per index:
-- $1 tenants, $2 keys, $3 types, $4 fingerprints, $5 payloads (JSON text), $6 trace contexts (JSON or NULL),
-- $7 stable ids (unique per request: they tie each inserted row back to its request), $8 tags and $9 search
-- terms, each a JSON array of strings or NULL (Postgres arrays are rectangular: an array of arrays of
-- different lengths cannot be passed), $10 destinations (providers.Destination, or NULL), $11 the keys'
-- retentions in milliseconds, $12 whether each payload goes to oncegate_effect_bodies (retention.payloads)
-- rather than into its effect's row, $13 each key's hold after its effect finished in milliseconds (as in
-- insert.sql). The trace id, for the operator, is the one of each traceparent; batched requests
-- have no job (a fenced request is not batched). No NOTIFY, as in insert.sql: the gateway announces new
-- effects after the commit.
-- Each key is claimed as insert.sql claims one: a key held (as this statement's snapshot has it) inserts
-- nothing and returns the effect it points at with created false; a free key, none or expired with a terminal
-- effect, is claimed, re-claimed by ON CONFLICT ... DO UPDATE. Of the requests of the batch with one key, only
-- the first tries to claim it (Postgres refuses an ON CONFLICT DO UPDATE that meets one row twice); the others,
-- and a key that a transaction took after this statement's snapshot, return no row for their request: the
-- caller reads them back (get_batch.sql). The keys are claimed in (tenant, key) order, so that two batches
-- that wait for each other's keys wait in the same order and cannot deadlock.
-- The keys and stored effects are read key by key (LATERAL), so that the plan probes the indexes whatever
-- the tables' sizes were when Postgres made it: a join of the batch to a table is planned as a sequential scan
-- while the table is small, and a prepared statement keeps that plan as the table grows.
-- The arrays reach unnest through a subquery that is not pulled up (OFFSET 0), so that a custom plan, like
-- the generic one, does not know the batch's size (Postgres counts a constant array's elements, not a
-- parameter's). Knowing it, custom plans of the small batches a quiet gateway sends first were so much
-- cheaper than the generic plan that Postgres planned every batch afresh, on every connection, for good
-- (it decides after five runs): replays in batches of two or three ran at a third of the rate
-- (BenchmarkReplay, callers=8, 3,700 a second against 11,000 with the generic plan).
WITH input AS (
    SELECT i.*
    FROM (SELECT $1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::text[], $10::text[], $11::bigint[], $12::boolean[], $13::bigint[] OFFSET 0)
        a (a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13)
    CROSS JOIN LATERAL unnest(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13)
        WITH ORDINALITY AS i (tenant, key, type, fingerprint, payload, trace, stable_id, tags, terms, destination,
            retention, apart, hold, ord)
), seen AS (
    SELECT input.ord, k.effect_id, coalesce(k.held, false) AS held
    FROM input LEFT JOIN LATERAL (
        SELECT k.effect_id,
            k.expires_at IS NULL OR k.expires_at >= now()
                OR EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
                OR oncegate_finished_within(k.effect_id, make_interval(secs => input.hold::double precision / 1000)) AS held
        FROM oncegate_keys k
        WHERE k.tenant = input.tenant AND k.key = input.key
    ) k ON true
), claimed AS (
    INSERT INTO oncegate_keys AS k (tenant, key, effect_id, fingerprint, expires_at)
    SELECT tenant, key, oncegate_next_effect_id(), fingerprint,
        now() + make_interval(secs => retention::double precision / 1000)
    FROM (
        SELECT DISTINCT ON (input.tenant, input.key) input.tenant, input.key, input.fingerprint, input.retention
        FROM input JOIN seen USING (ord)
        WHERE NOT seen.held
        ORDER BY input.tenant, input.key, input.ord
    ) first
    ON CONFLICT (tenant, key) DO UPDATE
    SET effect_id = EXCLUDED.effect_id, fingerprint = EXCLUDED.fingerprint, expires_at = EXCLUDED.expires_at
    WHERE k.expires_at < now()
        AND k.effect_id = (SELECT seen.effect_id FROM input JOIN seen USING (ord)
            WHERE input.tenant = k.tenant AND input.key = k.key LIMIT 1)
        AND NOT EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
        AND NOT oncegate_finished_within(k.effect_id, make_interval(secs => (SELECT input.hold FROM input
            WHERE input.tenant = k.tenant AND input.key = k.key LIMIT 1)::double precision / 1000))
    RETURNING k.tenant, k.key, k.effect_id
), effect AS (
    INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload, stable_id, trace_id, tags,
        search_terms)
    SELECT claimed.effect_id, first.tenant, first.key, first.type, first.fingerprint,
        CASE WHEN first.apart THEN NULL ELSE first.payload::json END,
        first.stable_id, NULLIF(split_part(first.trace::jsonb ->> 'traceparent', '-', 2), ''),
        (SELECT array_agg(t) FROM json_array_elements_text(first.tags::json) t),
        (SELECT array_agg(t) FROM json_array_elements_text(first.terms::json) t)
    FROM claimed CROSS JOIN LATERAL (
        SELECT * FROM input WHERE input.tenant = claimed.tenant AND input.key = claimed.key ORDER BY ord LIMIT 1
    ) first
    ORDER BY claimed.effect_id
    RETURNING {{written}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, trace, destination, tenant)
    SELECT effect.id, effect.type, input.trace::jsonb, input.destination, effect.tenant
    FROM effect JOIN input USING (stable_id)
), bodied AS (
    INSERT INTO oncegate_effect_bodies (effect_id, tenant, payload)
    SELECT effect.id, effect.tenant, input.payload::json
    FROM effect JOIN input USING (stable_id)
    WHERE input.apart
)
SELECT true AS created, {{written}} FROM effect
UNION ALL
SELECT false, stored.*
FROM input JOIN seen USING (ord) CROSS JOIN LATERAL (
    SELECT {{columns}} FROM oncegate_effects e WHERE e.id = seen.effect_id AND e.tenant = input.tenant LIMIT 1
) stored
WHERE seen.held
