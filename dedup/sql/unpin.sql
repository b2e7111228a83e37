-- Ends pin.sql's settings inside an explicit transaction, which goes on after the pinned statement, so that
-- the caller's other statements are planned as usual: each setting goes back, for the rest of the
-- transaction, to its default (the value RESET gives it). Six statements, queued one by one in the pinned
-- statement's batch (store.go): reading each setting's reset_val from pg_settings made Postgres build every
-- setting of the server, 1.7 ms a transaction (a quarter of a postgres-provider delivery's cost).
SET LOCAL enable_seqscan TO DEFAULT;
SET LOCAL enable_bitmapscan TO DEFAULT;
SET LOCAL enable_hashjoin TO DEFAULT;
SET LOCAL enable_mergejoin TO DEFAULT;
SET LOCAL enable_sort TO DEFAULT;
SET LOCAL jit TO DEFAULT
