-- The operator behind a live session (its token not revoked). $1 session hash
SELECT t.name, t.role
FROM oncegate_console_sessions s JOIN oncegate_operator_tokens t ON t.id = s.token_id
WHERE s.hash = $1 AND s.expires_at > now() AND t.revoked_at IS NULL
