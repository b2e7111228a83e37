-- $1 tenant, $2 key
SELECT {{columns}} FROM oncegate_effects WHERE tenant = $1 AND key = $2
