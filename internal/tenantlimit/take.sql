-- Takes up to $2 request tokens of tenant $1 from the bucket every gateway shares (oncegate_tenant_rate_buckets,
-- migration 00017), for a gateway to spend on its own: $3 the tenant's rate a second, $4 its burst.
--
-- GCRA, as outbox/sql/take_tokens.sql keeps a destination's bucket: the bucket is the time its next request is
-- due, tat; at now it holds floor((now - max(tat, now)) * $3 + $4) tokens, and each one granted moves tat on by
-- 1/$3. The row is locked by ON CONFLICT DO UPDATE, whose SET reads its latest committed version: takes from
-- several gateways queue on the row and never grant a token twice. A take may get fewer than it asked for,
-- none when the bucket is empty.
--
-- Returns granted, and next_ms: in ms from now, by the database's clock, until the bucket holds the $2 tokens
-- asked for (its burst at most). A gateway that got fewer waits that long before it asks again: a batch's
-- time, not a token's, so that the gateways of a tenant over its rate ask about once a batch, not once a
-- token; the bucket keeps what comes due meanwhile (up to its burst, which is at least a batch), so the wait
-- loses no token while a take is answered faster than the bucket fills.
INSERT INTO oncegate_tenant_rate_buckets AS b (tenant, tat, granted, per_second, burst, taken)
VALUES ($1, now() + make_interval(secs => least($2::integer, $4::integer) / $3::float8),
    least($2::integer, $4::integer), $3::float8, $4::integer, least($2::integer, $4::integer))
ON CONFLICT (tenant) DO UPDATE
SET granted = least(EXCLUDED.granted, greatest(0,
        floor(extract(epoch FROM now() - greatest(b.tat, now()))::float8 * $3::float8 + $4::integer + 1e-9)))::integer,
    tat = greatest(b.tat, now()) + make_interval(secs => least(EXCLUDED.granted, greatest(0,
        floor(extract(epoch FROM now() - greatest(b.tat, now()))::float8 * $3::float8 + $4::integer + 1e-9))) / $3::float8),
    taken = b.taken + least(EXCLUDED.granted, greatest(0,
        floor(extract(epoch FROM now() - greatest(b.tat, now()))::float8 * $3::float8 + $4::integer + 1e-9)))::integer,
    per_second = $3::float8, burst = $4::integer, updated_at = now()
RETURNING b.granted,
    ceil(greatest(0, extract(epoch FROM b.tat - make_interval(secs => ($4::integer - least($2::integer, $4::integer)) / $3::float8)
        - now())) * 1000)::bigint
