-- Makes a lease run for $3 ms from now (by the database's clock), under its token: the holder of an outcome
-- that it cannot record yet keeps the row from being rescued meanwhile. A lease that ran out is extended too
-- if no claim took the row since (the token is still on it): nobody else has it, so nobody else has sent it.
-- No row comes back when the token is no longer the row's, and then nothing changed.
-- $1 effect id, $2 lease token, $3 lease in ms
UPDATE oncegate_outbox
SET lease_expires_at = now() + make_interval(secs => $3::double precision / 1000)
WHERE effect_id = $1 AND lease_token = $2
RETURNING effect_id
