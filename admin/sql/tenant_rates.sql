-- The fleet-wide request buckets of the tenants whose rate has scope fleet (oncegate_tenant_rate_buckets,
-- issue 31), as the last take of each applied its rate: the rate, the burst, the tokens the bucket holds now
-- (GCRA: a full bucket holds the burst, and each token taken ahead of its time, tat past now, is one fewer),
-- every token granted since the row was made, and when a gateway last took some. Gateways take tokens in
-- batches (about 100 ms of the rate), so a bucket at 0 is a tenant at its limit, and one at its burst a tenant
-- that has sent nothing lately.
SELECT tenant, per_second, burst,
    greatest(0, least(burst, floor(burst - extract(epoch FROM greatest(tat - now(), interval '0')) * per_second + 1e-9)))::int,
    taken, updated_at
FROM oncegate_tenant_rate_buckets
ORDER BY tenant
