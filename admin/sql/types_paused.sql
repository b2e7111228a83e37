-- The paused effect types.
SELECT type, paused_by, paused_at, reason FROM oncegate_paused_types ORDER BY type
