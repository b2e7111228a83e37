-- Appends one operator action to the audit log. $1 actor, $2 role, $3 action, $4 target, $5 how many,
-- $6 filter (JSON) or NULL, $7 reason, $8 outcome
INSERT INTO oncegate_audit (actor, role, action, target, count, filter, reason, outcome)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8)
RETURNING id, at
