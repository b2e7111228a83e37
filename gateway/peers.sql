-- The other gateways of the fleet, for this one's dispatcher (outbox.Dispatcher.SetPeers): those seen within
-- $2 seconds (three heartbeats, as `oncegate gateway ls` counts them live), other than $1, with the effect
-- types they deliver and only their breakers that are not closed (a gateway's row lists every breaker it
-- keeps, up to a thousand a type and tenant: the closed ones say nothing here).
SELECT g.types,
    coalesce((SELECT jsonb_agg(b) FROM jsonb_array_elements(g.breakers) AS b WHERE b ->> 'state' <> 'closed'),
        '[]'::jsonb) AS breakers
FROM oncegate_gateways g
WHERE g.id <> $1 AND g.last_seen > now() - make_interval(secs => $2::double precision)
