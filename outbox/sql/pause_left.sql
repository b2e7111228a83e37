-- How long destination $2 of effect type $1 is paused still for tenant $3, in ms by the database's clock: its
-- own pause or every tenant's (''), the longer; NULL when neither holds: the pause ended, or an operator lifted
-- it (`oncegate destination resume`).
SELECT (SELECT ceil(extract(epoch FROM max(p.until) - now()) * 1000)::bigint
        FROM oncegate_destination_pauses p
        WHERE p.type = $1 AND p.destination = $2 AND p.tenant IN ('', $3) AND p.until > now())
