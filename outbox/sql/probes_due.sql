-- The pauses of effect types $1 whose rows are held (migration 00030) and whose probe is not out (never taken,
-- or its gateway died with it and its lease ran out), with the ms until each is due for its probe: its end,
-- by the database's clock (0 or less: due now). A small table, read at most every second by each gateway.
SELECT p.type, p.destination, p.tenant, ceil(extract(epoch FROM p.until - now()) * 1000)::bigint
FROM oncegate_destination_pauses p
WHERE p.type = ANY ($1::text[]) AND p.held_until > now() AND (p.probe_lease IS NULL OR p.probe_lease < now())
ORDER BY 4
LIMIT 1000
