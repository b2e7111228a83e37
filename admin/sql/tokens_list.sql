-- Every operator token, without its hash.
SELECT id, name, role, created_by, created_at, last_used, revoked_at
FROM oncegate_operator_tokens ORDER BY id
