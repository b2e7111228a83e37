-- One effect, with its payload and result, and the lease of its outbox row: which gateway holds its
-- delivery, and until when (an expired lease is a delivery its gateway died in, waiting for a rescue).
-- The effect is the one the key points at now (oncegate_keys): after the key was claimed again, the new
-- one; the old one is read by its id (effect_by_id.sql) until the purge deletes it.
-- $1 tenant, $2 key
SELECT {{columns}}, stable_id, COALESCE(payload, legacy_payload::json)::text, result::text,
    (SELECT o.lease_owner FROM oncegate_outbox o WHERE o.effect_id = oncegate_effects.id AND o.lease_token IS NOT NULL),
    (SELECT o.lease_expires_at FROM oncegate_outbox o WHERE o.effect_id = oncegate_effects.id AND o.lease_token IS NOT NULL)
FROM oncegate_effects
WHERE id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = $1 AND k.key = $2) AND tenant = $1
