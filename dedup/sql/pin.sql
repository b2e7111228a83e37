-- Runs in the same implicit transaction as the statement after it (pinned, in store.go), so that Postgres
-- plans that statement with sequential scans, bitmap scans, hash and merge joins and sorts priced out: what
-- is left is the plan the statement is written for, ordered index scans and nested loops over the batch's
-- rows, whatever the tables' statistics say. Each setting is local: it ends with the transaction.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
    set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
    set_config('enable_sort', 'off', true)
