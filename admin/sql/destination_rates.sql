-- Each destination's deliveries over the last hour, by effect type: attempts and what they came to, and the
-- median and 99th percentile latency of the calls made. The attempts are found by the BRIN index on
-- started_at; rows that record an operator's change (attempt 0) are not attempts. A busy hour is read whole,
-- so the page that shows it is not polled. $1 the window in seconds
SELECT COALESCE(type, '(not recorded)'), COALESCE(destination, '(not recorded)'),
    count(*),
    count(*) FILTER (WHERE outcome = 'delivered'),
    count(*) FILTER (WHERE outcome = 'failed'),
    count(*) FILTER (WHERE outcome = 'retry'),
    count(*) FILTER (WHERE outcome IN ('in_doubt', 'interrupted')),
    percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms),
    percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms),
    max(started_at)
FROM oncegate_effect_attempts
WHERE started_at > now() - make_interval(secs => $1::double precision) AND attempt > 0
GROUP BY 1, 2
ORDER BY 1, 2
