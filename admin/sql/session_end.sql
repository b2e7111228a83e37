-- A logout, and on the way the sessions that expired (served by the expiry index). $1 session hash
DELETE FROM oncegate_console_sessions WHERE hash = $1 OR expires_at < now()
