-- Records a new effect and its outbox row already leased to the caller, for a request that performs the
-- effect at once (the dedup proxy): no dispatcher can claim the row while the request holds it, and if the
-- request's gateway dies, the lease runs out and the row is rescued like any other. One statement, one
-- transaction: the key, the effect and its row commit, or none does. The key is claimed as insert.sql claims
-- it (a free key, none or expired with a terminal effect, is claimed; an expired one is re-claimed for a new
-- effect). A held key inserts nothing and returns the effect it points at with created false and no lease,
-- as insert.sql does (a replay is one statement, and writes nothing); no row at all when the key was taken
-- after the statement's snapshot, or when an operator paused the type (oncegate_paused_types): a paused type
-- is not delivered, and this request would deliver it at once, so nothing is recorded, not even the key.
-- $1 tenant, $2 key, $3 type, $4 fingerprint, $5 payload, $6 trace context (W3C, as JSON) or NULL,
-- $7 the effect's stable id, $8 lease owner, $9 lease in milliseconds, $10 the delivering status, $11 tags or
-- NULL, $12 search terms or NULL (as in insert.sql), $13 the key's retention in milliseconds, $14 whether
-- the payload goes to oncegate_effect_bodies, $16 the key's hold after its effect finished in milliseconds
-- (as in insert.sql), $15 its destination (providers.Destination) or NULL, as in insert.sql: the claims skip a paused destination's rows by it, and
-- an operator's resume of the destination makes them due (resume_destination.sql). The trace id,
-- for the operator, is the one of the traceparent in $6, as in insert.sql.
WITH held AS (
    SELECT k.effect_id,
        k.expires_at IS NULL OR k.expires_at >= now()
            OR EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
            OR oncegate_finished_within(k.effect_id, make_interval(secs => $16::double precision / 1000)) AS held
    FROM oncegate_keys k
    WHERE k.tenant = $1 AND k.key = $2
), claimed AS (
    INSERT INTO oncegate_keys AS k (tenant, key, effect_id, fingerprint, expires_at)
    SELECT $1, $2, oncegate_next_effect_id(), $4,
        now() + make_interval(secs => $13::double precision / 1000)
    WHERE NOT EXISTS (SELECT FROM held WHERE held.held)
        AND NOT EXISTS (SELECT FROM oncegate_paused_types WHERE type = $3)
    ON CONFLICT (tenant, key) DO UPDATE
    SET effect_id = EXCLUDED.effect_id, fingerprint = EXCLUDED.fingerprint, expires_at = EXCLUDED.expires_at
    WHERE k.effect_id = (SELECT held.effect_id FROM held) AND k.expires_at < now()
        AND NOT EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = k.effect_id OFFSET 0)
        AND NOT oncegate_finished_within(k.effect_id, make_interval(secs => $16::double precision / 1000))
    RETURNING k.effect_id
), effect AS (
    INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload, stable_id, status, trace_id, tags,
        search_terms)
    SELECT claimed.effect_id, $1, $2, $3, $4, CASE WHEN $14::boolean THEN NULL ELSE $5::json END, $7, $10, NULLIF(split_part($6::jsonb ->> 'traceparent', '-', 2), ''),
        $11::text[], $12::text[]
    FROM claimed
    RETURNING {{written}}
), queued AS (
    INSERT INTO oncegate_outbox (effect_id, type, trace, lease_token, lease_owner, lease_expires_at, tenant,
        destination)
    SELECT id, type, $6::jsonb, gen_random_uuid(), $8, now() + make_interval(secs => $9::double precision / 1000),
        tenant, $15::text
    FROM effect
    RETURNING effect_id, lease_token
), bodied AS (
    INSERT INTO oncegate_effect_bodies (effect_id, tenant, payload)
    SELECT claimed.effect_id, $1, $5::json FROM claimed WHERE $14::boolean
)
SELECT true AS created, {{written}}, queued.lease_token,
    -- What is left of a pause of the destination for the fleet (oncegate_destination_pauses), by the
    -- database's clock, asked here rather than by a statement of its own before the call (an unlimited type's
    -- request asked it in a second round trip).
    -- The tenant's pause or every tenant's (migration 00028), the longer.
    -- Past its end, a pause holds its rows while its probe is out (migration 00030), a second at a time.
    (SELECT ceil(extract(epoch FROM max(CASE WHEN p.until > now() THEN p.until
                ELSE least(p.held_until, now() + interval '1 second') END) - now()) * 1000)::bigint
     FROM oncegate_destination_pauses p
     WHERE p.type = $3 AND p.destination = $15 AND p.tenant IN ('', $1)
       AND greatest(p.until, p.held_until) > now()) AS paused_ms
FROM effect JOIN queued ON queued.effect_id = effect.id
UNION ALL
SELECT false, {{columns}}, NULL::uuid, NULL::bigint FROM oncegate_effects
WHERE id = oncegate_key_effect($1, $2) AND tenant = $1 AND EXISTS (SELECT FROM held WHERE held.held)
