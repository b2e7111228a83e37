-- How long destination $2 of effect type $1 is paused still for tenant $3, in ms by the database's clock: its
-- own pause or every tenant's (''), the longer; NULL when neither holds: the pause ended, or an operator lifted
-- it (`oncegate destination resume`). A pause whose end has passed holds its rows while its probe asks the
-- destination whether it is ready (held_until, migration 00030): it is asked again a second later at most.
SELECT (SELECT ceil(extract(epoch FROM max(CASE WHEN p.until > now() THEN p.until
                ELSE least(p.held_until, now() + interval '1 second') END) - now()) * 1000)::bigint
        FROM oncegate_destination_pauses p
        WHERE p.type = $1 AND p.destination = $2 AND p.tenant IN ('', $3)
          AND greatest(p.until, p.held_until) > now())
