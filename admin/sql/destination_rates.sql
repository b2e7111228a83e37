-- Each destination's deliveries over the last hour, by effect type, from the per-minute rollup the gateways
-- write with their attempt logs (oncegate_destination_minutes): at most 60 rows per type and destination,
-- however many attempts there were, read once; the latency buckets are summed element by element.
-- Beside them, what holds the destination back (issue 31): its fleet-wide limit as the last take of tokens
-- applied it (oncegate_rate_buckets), its calls a second over the last whole minute, the rows waiting for it
-- (due or not, unleased), and its pause when it asked for one (oncegate_destination_pauses). A destination
-- with rows waiting or a pause is listed even with no attempt in the hour: it is the one an operator looks for.
-- $1 the window in seconds
WITH m AS MATERIALIZED (
    SELECT * FROM oncegate_destination_minutes
    WHERE minute > now() - make_interval(secs => $1::double precision)
), buckets AS (
    SELECT type, destination, array_agg(n ORDER BY i) AS latency_buckets
    FROM (SELECT type, destination, i, sum(v)::bigint AS n
          FROM m, unnest(m.latency_buckets) WITH ORDINALITY AS t (v, i)
          GROUP BY type, destination, i) per_bucket
    GROUP BY type, destination
), rolled AS (
    SELECT m.type, m.destination, sum(m.attempts) AS attempts, sum(m.delivered) AS delivered,
        sum(m.failed) AS failed, sum(m.retried) AS retried, sum(m.in_doubt) AS in_doubt, b.latency_buckets,
        max(m.minute) AS last_minute,
        coalesce(sum(m.attempts) FILTER (WHERE m.minute = date_trunc('minute', now()) - interval '1 minute'), 0)
            / 60.0 AS per_second
    FROM m JOIN buckets b USING (type, destination)
    GROUP BY m.type, m.destination, b.latency_buckets
), waiting AS (
    SELECT type, destination, count(*) AS rows
    FROM oncegate_outbox
    WHERE destination IS NOT NULL AND lease_token IS NULL
    GROUP BY type, destination
), paused AS (
    -- A pause is a tenant's, or every tenant's ('', migration 00028): the longest, and whose they are. A
    -- tenant's pause whose end has passed holds its rows until its probe finds the destination ready
    -- (migration 00030): those tenants, and the gateway whose probe is out, if one is.
    SELECT type, destination, max(until) AS until, (array_agg(status ORDER BY until DESC))[1] AS status,
        (array_agg(paused_by ORDER BY until DESC))[1] AS paused_by, array_agg(tenant ORDER BY tenant) AS tenants,
        array_agg(tenant ORDER BY tenant) FILTER (WHERE until <= now()) AS ended,
        (array_agg(prober ORDER BY tenant) FILTER (WHERE until <= now() AND probe_lease > now()))[1] AS prober
    FROM oncegate_destination_pauses WHERE greatest(until, held_until) > now()
    GROUP BY type, destination
), keys AS (
    SELECT type, destination FROM rolled
    UNION SELECT type, destination FROM waiting
    UNION SELECT type, destination FROM paused
)
SELECT k.type, k.destination, coalesce(r.attempts, 0), coalesce(r.delivered, 0), coalesce(r.failed, 0),
    coalesce(r.retried, 0), coalesce(r.in_doubt, 0), r.latency_buckets, r.last_minute,
    coalesce(r.per_second, 0)::float8, rb.per_second, rb.burst, coalesce(w.rows, 0), p.until, p.status, p.paused_by,
    p.tenants, p.ended, p.prober
FROM keys k
LEFT JOIN rolled r USING (type, destination)
LEFT JOIN waiting w USING (type, destination)
LEFT JOIN paused p USING (type, destination)
LEFT JOIN oncegate_rate_buckets rb USING (type, destination)
ORDER BY k.type, k.destination
