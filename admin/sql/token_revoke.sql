-- Revokes a token by name, with its sessions. Returns how many tokens it revoked. $1 name
WITH t AS (
    UPDATE oncegate_operator_tokens SET revoked_at = now()
    WHERE name = $1 AND revoked_at IS NULL
    RETURNING id
), s AS (
    DELETE FROM oncegate_console_sessions WHERE token_id IN (SELECT id FROM t)
)
SELECT count(*) FROM t
