-- Records a new effect and its outbox row. One statement is one transaction: both rows commit, or neither.
-- When the tenant has used the key already, it inserts nothing and returns the stored effect with created
-- false, so that a replay costs one statement and no write (issue 14); of concurrent inserts of one key, the
-- unique constraint lets exactly one through. A key taken by a transaction that committed after this
-- statement's snapshot was taken returns no row at all: the caller reads it then. No NOTIFY here: it would
-- take Postgres's cluster-wide notification lock at every commit; the gateway announces new effects after the
-- commit, batched.
-- $1 tenant, $2 key, $3 type, $4 fingerprint, $5 payload, $6 trace context (W3C, as JSON) or NULL,
-- $7 the effect's stable id (effect.NewStableID), $8 the asking job's id or NULL, $9 its lease epoch or NULL,
-- $10 its tags or NULL, $11 its search terms (tags and recipients, lowercased) or NULL, $12 the job's queue
-- or NULL, $13 its destination (providers.Destination) or NULL.
-- The trace id, for the operator, is the one of the traceparent in $6.
WITH effect AS (
    INSERT INTO oncegate_effects (tenant, key, type, fingerprint, payload, stable_id, job_id, job_epoch, trace_id,
        tags, search_terms, job_queue)
    VALUES ($1, $2, $3, $4, $5, $7, $8::text, $9::bigint, NULLIF(split_part($6::jsonb ->> 'traceparent', '-', 2), ''),
        $10::text[], $11::text[], $12::text)
    ON CONFLICT (tenant, key) DO NOTHING
    RETURNING {{written}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, trace, destination, tenant)
    SELECT id, type, $6::jsonb, $13::text, tenant FROM effect
)
SELECT true AS created, {{written}} FROM effect
UNION ALL
SELECT false, {{columns}} FROM oncegate_effects
WHERE tenant = $1 AND key = $2 AND NOT EXISTS (SELECT FROM effect)
