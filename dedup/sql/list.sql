-- A page of a tenant's effects, newest first. $1 tenant, $2 status or NULL, $3 type or NULL, $4 the id the
-- previous page ended at or NULL, $5 page size.
SELECT {{columns}} FROM oncegate_effects
WHERE tenant = $1
  AND {{status_is $2}}
  AND ($3::text IS NULL OR type = $3)
  AND ($4::bigint IS NULL OR id < $4)
ORDER BY id DESC
LIMIT $5
