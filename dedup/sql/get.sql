-- The effect the tenant's key points at now (oncegate_keys): after the key was claimed again, the new one.
-- Read by id, so that effects split by time (issue 30's phase 2) are read without their key.
-- Through oncegate_key_effect, so that Postgres opens only the partition that holds it (insert.sql says why).
-- $1 tenant, $2 key
SELECT {{columns}} FROM oncegate_effects
WHERE id = oncegate_key_effect($1, $2) AND tenant = $1
