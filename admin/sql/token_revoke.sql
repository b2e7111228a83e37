-- Revokes the live tokens named $1, with their sessions: every one of them, or, when $2 is not NULL, the one
-- with that id only (a rotation: the holder's new token stays). Returns how many tokens it revoked.
WITH t AS (
    UPDATE oncegate_operator_tokens SET revoked_at = now()
    WHERE name = $1 AND revoked_at IS NULL AND ($2::bigint IS NULL OR id = $2::bigint)
    RETURNING id
), s AS (
    DELETE FROM oncegate_console_sessions WHERE token_id IN (SELECT id FROM t)
)
SELECT count(*) FROM t
