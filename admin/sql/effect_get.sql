-- One effect, with its payload and result. $1 tenant, $2 key
SELECT {{columns}}, stable_id, COALESCE(payload, legacy_payload::json)::text, result::text
FROM oncegate_effects
WHERE tenant = $1 AND key = $2
