-- A login: the live token with this hash opens a session (its hash $2, ending at now() + $3 seconds).
-- Returns nothing for an unknown or revoked token. $1 token hash, $2 session hash, $3 lifetime in seconds
WITH t AS (
    UPDATE oncegate_operator_tokens SET last_used = now()
    WHERE hash = $1 AND revoked_at IS NULL
    RETURNING id, name, role
), s AS (
    INSERT INTO oncegate_console_sessions (hash, token_id, expires_at)
    SELECT $2, id, now() + make_interval(secs => $3) FROM t
)
SELECT name, role FROM t
