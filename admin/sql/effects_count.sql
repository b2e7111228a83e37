-- How many effects match a filter: the dry run of a bulk action, asked for once, never on a listing.
-- Parameters as effects_list.sql, without the cursor and the page size: $7, $8 and $9 are its $9, $10 and $11.
SELECT count(*)
FROM oncegate_effects
WHERE ($1::text IS NULL OR tenant = $1)
  AND ($2::text IS NULL OR type = $2)
  AND {{status_is $3}}
  AND ($4::text IS NULL OR key LIKE $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($9::bigint IS NULL OR id >= $9)
  AND ($6::text IS NULL OR job_id = $6)
  AND ($7::text IS NULL OR search_terms @> ARRAY[$7::text] OR key = $8)
  -- $10: only effects whose payload is still there to send (a bulk retry's count): not one whose body
  -- expired (retention.payloads), which a retry leaves as it is.
  AND (NOT $10::boolean OR payload IS NOT NULL OR legacy_payload IS NOT NULL
       OR EXISTS (SELECT FROM oncegate_effect_bodies b WHERE b.effect_id = oncegate_effects.id))
