-- Takes delivery tokens of effect type $1 for a claim's rows, per destination, from the buckets every gateway
-- shares (oncegate_rate_buckets, migration 00015), in one statement. $2 the destinations, sorted (buckets are
-- locked in that order, so two gateways' takes never deadlock), $3 how many rows of each the claim holds, at
-- most $5; $4 the limit's rate a second, $5 its burst; $6 the tenant whose own pauses count too ('': none).
--
-- GCRA: a bucket is the time its next call is due, tat; at now it has floor((now - max(tat, now)) * $4 + $5)
-- tokens, and each one granted moves tat on by 1/$4. The row is locked by ON CONFLICT DO UPDATE, whose SET
-- reads its latest committed version: takes from several gateways queue on the row, never grant a token twice.
-- A destination that asked the fleet to wait for every tenant (oncegate_destination_pauses) takes none.
--
-- Per destination: granted, how many of its rows may be attempted now; next_ms, in ms from now by the
-- database's clock, when its next token is due (the end of its pause when it is paused); left, the tokens
-- it has now; paused.
WITH want AS (
    SELECT w.destination, w.n,
        -- Every tenant's pause, and tenant $6's ('' for none: a claim's rows, whose tenants' own pauses
        -- (migration 00028) the dispatcher holds them back for before the take, as the claim that left them
        -- out knew them; a request's own attempt names its tenant).
        -- Past its end, a pause holds its rows while its probe is out (migration 00030), a second at a time.
        (SELECT max(CASE WHEN p.until > now() THEN p.until ELSE least(p.held_until, now() + interval '1 second') END)
         FROM oncegate_destination_pauses p
         WHERE p.type = $1 AND p.destination = w.destination AND p.tenant IN ('', $6)
           AND greatest(p.until, p.held_until) > now())
            AS paused_until
    FROM unnest($2::text[], $3::integer[]) AS w (destination, n)
), taken AS (
    INSERT INTO oncegate_rate_buckets AS b (type, destination, tat, granted, per_second, burst, taken)
    SELECT $1, want.destination, now() + make_interval(secs => least(want.n, $5::integer) / $4::float8),
        least(want.n, $5::integer), $4::float8, $5::integer, least(want.n, $5::integer)
    FROM want
    WHERE want.paused_until IS NULL
    ORDER BY want.destination
    ON CONFLICT (type, destination) DO UPDATE
    SET granted = least(EXCLUDED.granted, greatest(0,
            floor(extract(epoch FROM now() - greatest(b.tat, now()))::float8 * $4::float8 + $5::integer + 1e-9)))::integer,
        tat = greatest(b.tat, now()) + make_interval(secs => least(EXCLUDED.granted, greatest(0,
            floor(extract(epoch FROM now() - greatest(b.tat, now()))::float8 * $4::float8 + $5::integer + 1e-9))) / $4::float8),
        taken = b.taken + least(EXCLUDED.granted, greatest(0,
            floor(extract(epoch FROM now() - greatest(b.tat, now()))::float8 * $4::float8 + $5::integer + 1e-9)))::integer,
        per_second = $4::float8, burst = $5::integer, updated_at = now()
    RETURNING b.destination, b.granted, b.tat
)
SELECT want.destination, coalesce(taken.granted, 0),
    ceil(greatest(0, extract(epoch FROM coalesce(want.paused_until,
        taken.tat - make_interval(secs => ($5::integer - 1) / $4::float8)) - now())) * 1000)::bigint,
    greatest(0, $5::integer - extract(epoch FROM taken.tat - now())::float8 * $4::float8),
    want.paused_until IS NOT NULL
FROM want
LEFT JOIN taken ON taken.destination = want.destination
