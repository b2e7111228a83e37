-- A page of the audit log, newest first, keyset on id. $1 actor or NULL, $2 action or NULL, $3 at or after or
-- NULL, $4 id below (the cursor) or NULL, $5 page size
SELECT id, at, actor, role, action, target, count, filter::text, reason, outcome
FROM oncegate_audit
WHERE ($1::text IS NULL OR actor = $1)
  AND ($2::text IS NULL OR action = $2)
  AND ($3::timestamptz IS NULL OR at >= $3)
  AND ($4::bigint IS NULL OR id < $4)
ORDER BY id DESC
LIMIT $5
