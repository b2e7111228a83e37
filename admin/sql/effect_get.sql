-- One effect, with its payload and result, and the lease of its outbox row: which gateway holds its
-- delivery, and until when (an expired lease is a delivery its gateway died in, waiting for a rescue).
-- The effect is the one the key points at now (oncegate_keys): after the key was claimed again, the new
-- one; the old one is read by its id (effect_by_id.sql) until the purge deletes it.
-- The payload and result of an effect whose body is kept apart (retention.payloads, migration 00025) are
-- read from oncegate_effect_bodies; an effect with neither payload column and no body row is one whose body
-- expired (the columns' body_expired).
-- $1 tenant, $2 key
SELECT {{columns}}, stable_id,
    COALESCE(oncegate_effects.payload, oncegate_effects.legacy_payload::json, b.payload)::text,
    COALESCE(b.result, oncegate_effects.result)::text,
    (SELECT o.lease_owner FROM oncegate_outbox o WHERE o.effect_id = oncegate_effects.id AND o.lease_token IS NOT NULL),
    (SELECT o.lease_expires_at FROM oncegate_outbox o WHERE o.effect_id = oncegate_effects.id AND o.lease_token IS NOT NULL)
FROM oncegate_effects
LEFT JOIN LATERAL (
    SELECT b.effect_id, b.payload, b.result FROM oncegate_effect_bodies b
    WHERE b.effect_id = oncegate_effects.id AND oncegate_effects.payload IS NULL
        AND oncegate_effects.legacy_payload IS NULL
) b ON true
WHERE id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = $1 AND k.key = $2) AND tenant = $1
