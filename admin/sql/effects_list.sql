-- A page of effects, newest first, for `effect ls` and the console: keyset pagination on id (the cursor is the
-- last id of the previous page), so every page costs an index range, never an OFFSET or a COUNT. Each filter
-- is off when its parameter is NULL. The admin pool plans every statement with its parameters
-- (plan_cache_mode = force_custom_plan), so each combination of filters gets the index that serves it:
-- (status, id), (type, status, id), (tenant, id), (key text_pattern_ops) for a prefix, (job_id), and for a
-- search the GIN index on search_terms or'd with the key's index (a bitmap of both).
-- $1 tenant, $2 type, $3 status, $4 key LIKE pattern (an escaped prefix and %), $5 created at or after,
-- $6 id below (the cursor), $7 job id, $8 page size, $9 a search term (lowercased): a tag, a recipient, or
-- the key itself, $10 the search as typed (keys are case-sensitive), $11 the lowest id an effect created at or
-- after $5 can have (effects_since.sql), so that the index serving the other filters stops there
SELECT {{columns}}
FROM oncegate_effects
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text IS NULL OR type = $2)
  AND {{status_is $3}}
  AND ($4::text IS NULL OR key LIKE $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($6::bigint IS NULL OR id < $6)
  AND ($11::bigint IS NULL OR id >= $11)
  AND ($7::text IS NULL OR job_id = $7)
  AND ($9::text IS NULL OR search_terms @> ARRAY[$9::text] OR key = $10)
ORDER BY id DESC
LIMIT $8
