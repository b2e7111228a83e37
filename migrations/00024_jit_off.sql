-- +goose Up

-- The database's sessions plan without JIT compilation. Every statement oncegate runs is a lookup or a
-- small write, but over partitioned tables (migration 00023) a plan is costed as if every partition were
-- read, one probe each, and crosses jit_above_cost: a 1,000-row listing spent 4.5 s compiling itself and
-- 10 ms running. A setting of the database, not of each connection, because a connection through PgBouncer
-- cannot send it (PgBouncer refuses startup parameters it does not know); it applies to the sessions that
-- start after it. Only the database's owner (or a superuser) may set it: a gateway whose role is neither
-- says so in its migration log and goes on, and `ALTER DATABASE ... SET jit = off` is then the DBA's.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET jit = off', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'oncegate: could not turn JIT off for database %: run ALTER DATABASE % SET jit = off as its owner',
        current_database(), current_database();
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I RESET jit', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    NULL;
END
$$;
-- +goose StatementEnd
