id, tenant, key, type, fingerprint, {{status}}, attempts, {{result}}, last_error, created_at, updated_at, delivered_at, next_attempt_at, stable_id, {{body_expired}}
