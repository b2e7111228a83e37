-- How long destination $2 of effect type $1 is paused still, in ms by the database's clock; NULL when it is
-- not: the pause ended, or an operator lifted it (`oncegate destination resume`).
SELECT (SELECT ceil(extract(epoch FROM p.until - now()) * 1000)::bigint
        FROM oncegate_destination_pauses p
        WHERE p.type = $1 AND p.destination = $2 AND p.until > now())
