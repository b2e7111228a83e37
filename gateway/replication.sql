-- The replication of the server the gateway writes to, for /readyz, /metrics and the log at start: its
-- synchronous_commit and synchronous_standby_names, and its physical standbys counted by sync_state (JSON
-- object). pg_stat_replication shows another user's walsenders to superusers and members of pg_read_all_stats
-- (pg_monitor) only: to anyone else their sync_state is NULL, counted as 'unknown' rather than taken for none.
-- Logical walsenders (connected to a database: change data capture, logical replication) and base backups
-- are no standby to fail over to, and are left out.
SELECT current_setting('synchronous_commit'),
       current_setting('synchronous_standby_names'),
       coalesce((SELECT json_object_agg(s.sync_state, s.n)::text
                 FROM (SELECT coalesce(r.sync_state, 'unknown') AS sync_state, count(*) AS n
                       FROM pg_stat_replication r
                       LEFT JOIN pg_stat_activity a ON a.pid = r.pid
                       WHERE a.datname IS NULL AND r.state IS DISTINCT FROM 'backup'
                       GROUP BY 1) s), '{}')
