-- Ends pin.sql's settings inside an explicit transaction, which goes on after the pinned statement, so that
-- the caller's other statements are planned as usual: each setting goes back, for the rest of the
-- transaction, to the value it has outside it.
SELECT set_config(name, reset_val, true)
FROM pg_settings
WHERE name IN ('enable_seqscan', 'enable_bitmapscan', 'enable_hashjoin', 'enable_mergejoin', 'enable_sort')
