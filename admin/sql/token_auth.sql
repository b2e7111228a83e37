-- The operator behind a live token, for the JSON API's bearer tokens. $1 token hash
UPDATE oncegate_operator_tokens SET last_used = now()
WHERE hash = $1 AND revoked_at IS NULL
RETURNING name, role
