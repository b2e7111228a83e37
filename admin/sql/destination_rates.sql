-- Each destination's deliveries over the last hour, by effect type, from the per-minute rollup the gateways
-- write with their attempt logs (oncegate_destination_minutes): at most 60 rows per type and destination,
-- however many attempts there were, read once; the latency buckets are summed element by element.
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
)
SELECT m.type, m.destination, sum(m.attempts), sum(m.delivered), sum(m.failed), sum(m.retried), sum(m.in_doubt),
    b.latency_buckets, max(m.minute)
FROM m JOIN buckets b USING (type, destination)
GROUP BY m.type, m.destination, b.latency_buckets
ORDER BY m.type, m.destination
