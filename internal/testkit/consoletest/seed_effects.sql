-- Seeds $1 effects with keys $3 || i, created evenly over $2 seconds ending $4 seconds ago: two tenants,
-- three types, and statuses as a real gateway leaves them: mostly delivered, one in 200 failed, one in 500
-- pending (with its outbox row), one in 1,000 dead and one in 1,000 unknown. Each has a job, an epoch, a
-- trace id, some replays, and its delivery attempts; an email is searchable by its recipient, as the gateway
-- records it. Each has its key. $1 count, $2 span in seconds, $3 key prefix, $4 end in seconds
WITH e AS (
    INSERT INTO oncegate_effects (id, tenant, key, type, fingerprint, payload, status, attempts, result, last_error,
        created_at, updated_at, delivered_at, finished_at, next_attempt_at, job_id, job_epoch, trace_id, stable_id,
        search_terms)
    -- An id telling its created_at's second, as oncegate_next_effect_id() draws it (migration 00023), so that
    -- each effect is in the partition of the time it was made.
    SELECT oncegate_effect_id_at(c) + i % 4194304,
           CASE WHEN i % 2 = 0 THEN 'acme' ELSE 'globex' END,
           $3 || i,
           (ARRAY['email', 'webhook', 'analytics'])[1 + i % 3],
           sha256(convert_to($3 || i, 'UTF8')),
           json_build_object('to', 'customer' || i || '@example.com', 'subject', 'Your order ' || i || ' shipped',
               'amount_cents', i % 10000),
           st,
           CASE st WHEN 'pending' THEN 0 WHEN 'delivered' THEN 1 ELSE 5 END,
           CASE WHEN st = 'delivered' THEN jsonb_build_object('id', 'msg-' || i) END,
           CASE st WHEN 'failed' THEN 'smtp 550 5.1.1: mailbox unavailable'
                   WHEN 'dead' THEN 'connection refused (5 attempts)'
                   WHEN 'unknown' THEN 'timeout after the request was sent: it may have been performed' END,
           c, c + interval '2 seconds',
           CASE WHEN st = 'delivered' THEN c + interval '2 seconds' END,
           CASE WHEN st <> 'pending' THEN c + interval '2 seconds' END,
           CASE WHEN st = 'pending' THEN c END,
           'job-' || (i / 2), 1 + i % 3, md5($3 || i),
           'eff_' || md5('stable' || $3 || i),
           CASE WHEN i % 3 = 0 THEN ARRAY['customer' || i || '@example.com', 'customer' || i] END
    FROM generate_series(1, $1::int) i,
         LATERAL (SELECT now() - make_interval(secs => $4::float8 + ($1 - i) * $2::float8 / $1) AS c,
                         CASE WHEN i % 1000 = 7 THEN 'dead' WHEN i % 1000 = 13 THEN 'unknown'
                              WHEN i % 200 = 3 THEN 'failed' WHEN i % 500 = 11 THEN 'pending'
                              ELSE 'delivered' END AS st) x
    ORDER BY i
    RETURNING id, tenant, key, fingerprint, type, status, attempts, created_at, job_epoch
), k AS (
    -- The key each one's create claimed (oncegate_keys), which reads by key go through.
    INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
    SELECT tenant, key, id, fingerprint, created_at + interval '1 day' FROM e
), r AS (
    -- Three in four absorbed replays; one in eight of those last came from an older epoch (a stale worker).
    INSERT INTO oncegate_effect_replays (effect_id, replays, last_replay_at, last_replay_epoch)
    SELECT id, id % 4, created_at + interval '5 seconds', CASE WHEN id % 8 = 1 THEN job_epoch - 1 ELSE job_epoch END
    FROM e WHERE id % 4 > 0
), o AS (
    INSERT INTO oncegate_outbox (effect_id, type, run_at)
    SELECT id, type, created_at FROM e WHERE status = 'pending'
)
INSERT INTO oncegate_effect_attempts (effect_id, attempt, started_at, gateway, lease_token, outcome, error, latency_ms,
    type, destination)
SELECT e.id, n, e.created_at + make_interval(secs => n), 'gw-' || (1 + e.id % 2), gen_random_uuid(),
       CASE WHEN e.status = 'delivered' THEN 'delivered'
            WHEN n < e.attempts THEN 'retry'
            WHEN e.status = 'unknown' THEN 'in_doubt'
            ELSE 'failed' END,
       CASE WHEN e.status <> 'delivered' THEN 'connection refused' END,
       40 + (e.id % 200),
       e.type, CASE e.type WHEN 'email' THEN 'smtp.example.com:587' WHEN 'webhook' THEN 'hooks.example.com'
                           ELSE 'analytics_events' END
FROM e, generate_series(1, e.attempts) n
