-- Runs in the same implicit transaction as the statement after it (pinned, in store.go), so that Postgres
-- plans that statement with sequential scans, bitmap scans, hash and merge joins and sorts priced out: what
-- is left is the plan the statement is written for, ordered index scans and nested loops over the batch's
-- rows, whatever the tables' statistics say. Each setting is local: it ends with the transaction. JIT is off:
-- a priced-out sort a plan cannot avoid (claim_limited.sql ranks a few dozen candidates) costs the plan
-- 10^10, far above jit_above_cost, and Postgres spent 450 ms compiling a statement that runs in 1.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
    set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
    set_config('enable_sort', 'off', true), set_config('jit', 'off', true)
