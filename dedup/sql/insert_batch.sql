-- Records the new effects of many concurrent requests, and their outbox rows, in one statement: one commit
-- (one WAL flush) for all of them instead of one each. The arrays hold one request per index:
-- $1 tenants, $2 keys, $3 types, $4 fingerprints, $5 payloads (JSON text), $6 trace contexts (JSON or NULL),
-- $7 stable ids (unique per request: they tie each inserted row back to its request), $8 tags and $9 search
-- terms, each a JSON array of strings or NULL (Postgres arrays are rectangular: an array of arrays of
-- different lengths cannot be passed), $10 destinations (providers.Destination, or NULL). The trace id, for the
-- operator, is the one of each traceparent; batched requests have no job (a fenced request is not batched).
-- No NOTIFY, as in insert.sql: the gateway announces new effects after the commit.
-- A key that exists already inserts nothing and returns the stored effect with created false, as insert.sql
-- does for one request. A key that an earlier request of the same batch takes, or that a transaction took
-- after this statement's snapshot, returns no row for its request: the caller reads it back (get_batch.sql).
-- The stored effects are read key by key (LATERAL ... LIMIT 1), so that the plan probes the unique index
-- whatever the table's size was when Postgres made it: a join of the batch to the table is planned as a
-- sequential scan while the table is small, and a prepared statement keeps that plan as the table grows.
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[],
        $9::text[], $10::text[])
        WITH ORDINALITY AS i (tenant, key, type, fingerprint, payload, trace, stable_id, tags, terms, destination, ord)
), effect AS (
    INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id, trace_id, tags, search_terms)
    SELECT tenant, key, type, fingerprint, payload::json, stable_id,
        NULLIF(split_part(trace::jsonb ->> 'traceparent', '-', 2), ''),
        (SELECT array_agg(t) FROM json_array_elements_text(tags::json) t),
        (SELECT array_agg(t) FROM json_array_elements_text(terms::json) t)
    FROM input ORDER BY ord
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING {{written}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, trace, destination, tenant)
    SELECT effect.id, effect.type, input.trace::jsonb, input.destination, effect.tenant
    FROM effect JOIN input USING (stable_id)
)
SELECT true AS created, {{written}} FROM effect
UNION ALL
SELECT false, stored.*
FROM input CROSS JOIN LATERAL (
    SELECT {{columns}} FROM oncegate_effects e WHERE e.tenant = input.tenant AND e.key = input.key LIMIT 1
) stored
WHERE NOT EXISTS (SELECT FROM effect WHERE effect.stable_id = input.stable_id)
