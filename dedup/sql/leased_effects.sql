-- What delivering leased rows needs of their effects, without the payloads (ClaimLeases; a claim reads them
-- with its payloads, read_payloads.sql): $1 effect ids. The claim itself reads no effect (claim.sql says
-- why). An effect that is not there (purged meanwhile) does not come back: its lease runs out unused.
SELECT e.id, e.tenant, e.key, e.type, e.attempts, e.created_at, e.stable_id
FROM unnest($1::bigint[]) AS l (effect_id)
CROSS JOIN LATERAL (SELECT * FROM oncegate_effects e WHERE e.id = l.effect_id LIMIT 1) e
