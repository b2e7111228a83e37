-- Records the terminal outcomes of many leased rows in one statement and one commit, each under its own
-- lease, as finish.sql does for one: a row whose lease was lost is left alone and its id is not returned.
-- $1 effect ids, $2 lease tokens (uuid text), $3 statuses, $4 results (JSON text, NULL to keep the stored
-- one), $5 last errors (NULL clears), $6 attempts to add, $7 whether delivered (then delivered_at is now);
-- paired by index. The answer of an effect whose body is kept apart (retention.payloads: neither payload
-- column set) goes to its row of oncegate_effect_bodies.
WITH input AS (
    SELECT *
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::boolean[])
        AS i (effect_id, token, status, result, last_error, attempts, delivered)
), gone AS (
    -- = ANY: the rows by the primary key whatever the plan's join order. An outbox vacuumed empty is believed
    -- empty until the next ANALYZE, and a join alone read the whole of a new burst as the outer side of its
    -- loop (1.85 s a batch beside 100,000 rows in the fleet bench).
    DELETE FROM oncegate_outbox o
    USING input
    WHERE o.effect_id = ANY ($1::bigint[]) AND o.effect_id = input.effect_id AND o.lease_token = input.token::uuid
    RETURNING o.effect_id
), answered AS (
    UPDATE oncegate_effect_bodies b
    SET result = input.result::jsonb
    FROM gone JOIN input USING (effect_id)
    WHERE b.effect_id = ANY ($1::bigint[]) AND b.effect_id = gone.effect_id AND input.result IS NOT NULL
)
UPDATE oncegate_effects e
SET status = input.status,
    attempts = e.attempts + input.attempts,
    result = CASE WHEN e.payload IS NULL AND e.legacy_payload IS NULL THEN e.result
        ELSE COALESCE(input.result::jsonb, e.result) END,
    last_error = input.last_error,
    delivered_at = CASE WHEN input.delivered THEN now() ELSE e.delivered_at END,
    next_attempt_at = NULL,
    finished_at = now(),
    updated_at = now()
FROM gone JOIN input USING (effect_id)
WHERE e.id = ANY ($1::bigint[]) AND e.id = gone.effect_id
RETURNING e.id
