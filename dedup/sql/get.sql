-- The effect the tenant's key points at now (oncegate_keys): after the key was claimed again, the new one.
-- Read by id, so that effects split by time (issue 30's phase 2) are read without their key.
-- $1 tenant, $2 key
SELECT {{columns}} FROM oncegate_effects
WHERE id = (SELECT k.effect_id FROM oncegate_keys k WHERE k.tenant = $1 AND k.key = $2) AND tenant = $1
