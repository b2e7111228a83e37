-- Records an operator token by its SHA-256. $1 name, $2 role, $3 hash, $4 who made it
INSERT INTO oncegate_operator_tokens (name, role, hash, created_by) VALUES ($1, $2, $3, $4)
RETURNING id, created_at
