-- claim.sql for an effect type with a fleet-wide delivery limit (outbox/rates.go): the same leases, the same
-- columns, but chosen by destination (each outbox row names its own, written with its effect). Rows of a
-- destination that is paused (oncegate_destination_pauses) or has no token now (its bucket's next token is
-- not due: oncegate_rate_buckets) are left alone, so that one destination's backlog never fills the claims
-- of the type's others; and of each destination no more rows are taken than the tokens its bucket holds
-- now, so that a claim seldom takes rows it must hand back. The buckets are read here, not written: the
-- dispatcher takes the tokens next (take_tokens.sql), and hands back the rows another gateway's take beat
-- it to. Rows whose destination is not known (NULL: written before it was kept, or sent back by a retry)
-- count as one destination, with the limit's burst for room.
-- Claims go round the tenants with work, as claim.sql's do, and so do a destination's tokens: the tenants
-- with rows of the type are found by the same loose scan of oncegate_outbox_tenant_due (a probe a tenant),
-- each brings its first $2 due rows of destinations with a token, and the candidates are taken in
-- rounds, the first of every tenant, then the second, and so on. Of each destination the rows that fit its
-- room are the first in that order, so a destination with room for 4 gives 2 to each of two tenants with
-- rows for it. Within a round the tenants go in a random order drawn at each claim, not oldest first: a
-- limited destination's claims mostly find room for one row (a token comes, a claim takes it), and the
-- tenant with the backlog always has the oldest head, so it would take every token; drawn, each of T
-- tenants with rows for the destination takes one in T, with no state kept between claims. One tenant's
-- backlog of 100,000 rows to a destination limited at 50 a second takes every
-- other token while another tenant has rows for it, where ordering by due time alone made the other's new
-- rows wait for the whole backlog at the limit's pace (issue 31). A tenant brings $2 rows, as in claim.sql,
-- not the $2 × 4 a claim by due time alone read in all: with 51 tenants and 100,000 rows the claim took 5 to
-- 8 ms (claim.sql: 5 to 6), against 12 to 18 with $2 × 4 each. A tenant whose first $2 rows go to a
-- destination with less room than that gets that room this claim; the destination has no token at the next,
-- which then reaches the tenant's rows to other destinations. Rows without a tenant (written before it was
-- kept) are one tenant of their own.
-- The candidates are the first $2 × 4 of the rounds; the rows leased are the first $2 of them that fit their
-- destination's room, rechecked under lock.
-- $1..$5 as in claim.sql; $6 the limit's burst.
WITH RECURSIVE tenants AS (
    (SELECT o.tenant FROM oncegate_outbox o WHERE o.type = $1 AND o.tenant IS NOT NULL ORDER BY o.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant FROM oncegate_outbox o WHERE o.type = $1 AND o.tenant > tenants.tenant
            ORDER BY o.tenant LIMIT 1)
    FROM tenants
    WHERE tenants.tenant IS NOT NULL
), heads AS (
    SELECT h.effect_id, h.destination, h.run_at, h.rescue,
        row_number() OVER (PARTITION BY t.tenant ORDER BY h.run_at) AS k,
        random() AS draw
    FROM tenants t
    CROSS JOIN LATERAL (
        -- The tenant's first $2 open rows among its first $2 × 8 due rows (one range of
        -- oncegate_outbox_tenant_due, as in claim.sql): the walk stops at the $2nd open row.
        WITH fast AS (
            SELECT w.effect_id, w.destination, w.run_at, w.rescue
            FROM (
                SELECT o.effect_id, o.destination, o.run_at,
                    coalesce(o.lease_expires_at > '-infinity'::timestamptz, false) AS rescue,
                    -- A lease that ran out (not one handed back, '-infinity') is rescued whatever its
                    -- destination's pause or tokens, as in claim.sql: its gateway died, and the rescue counts
                    -- the interrupted attempt and decides on it (an at_most_once effect is unknown) without a
                    -- call; a row to be called again then waits for its pause or its token, uncharged.
                    o.lease_expires_at > '-infinity'::timestamptz
                    OR NOT EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                        WHERE p.type = $1 AND p.destination = o.destination AND p.tenant IN ('', o.tenant)
                          AND greatest(p.until, p.held_until) > now())
                    AND NOT EXISTS (SELECT 1 FROM oncegate_rate_buckets b
                        WHERE b.type = $1 AND b.destination = o.destination
                          AND b.tat > now() + make_interval(secs => (b.burst - 1) / b.per_second)) AS open
                FROM oncegate_outbox o
                WHERE o.type = $1
                  AND (o.tenant, o.run_at) >= (t.tenant, '-infinity'::timestamptz)
                  AND (o.tenant, o.run_at) <= (t.tenant, now())
                  AND o.run_at <= now()
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
                ORDER BY o.tenant, o.run_at
                LIMIT $2 * 8
            ) w
            WHERE w.open
            LIMIT $2
        ), held AS (
            -- Else held-back destinations stand in front of the rest, which are found by destination: when
            -- the walk found fewer than $2 open rows and was cut short (asked only then).
            SELECT (SELECT count(*) FROM fast) < $2 AND (SELECT count(*) FROM (
                SELECT 1 FROM oncegate_outbox o
                WHERE o.type = $1
                  AND (o.tenant, o.run_at) >= (t.tenant, '-infinity'::timestamptz)
                  AND (o.tenant, o.run_at) <= (t.tenant, now())
                  AND o.run_at <= now()
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
                ORDER BY o.tenant, o.run_at
                LIMIT $2 * 8) x) = $2 * 8 AS yes
        ), dests AS (
            -- The tenant's open destinations, by a loose scan of oncegate_outbox_tenant_destination_due in
            -- name order, a probe each, which stops at the $2nd open one, or after 10,000: the rows of a tenant
            -- with more held-back destinations than that wait for some of them to open (an outside test's
            -- tenant had 1,002, each waiting 17 minutes for its token, and the scan's first bound of 1,000
            -- destinations read left its rows to an open one unclaimed).
            SELECT names.destination
            FROM held
            CROSS JOIN LATERAL (
                WITH RECURSIVE names (destination, open, found, n) AS (
                    (SELECT d.destination, f.open, f.open::integer, 1
                     FROM (SELECT o.destination FROM oncegate_outbox o
                           WHERE o.type = $1 AND o.tenant = t.tenant AND o.destination IS NOT NULL
                           ORDER BY o.destination LIMIT 1) d
                     CROSS JOIN LATERAL (SELECT NOT EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                            WHERE p.type = $1 AND p.destination = d.destination AND p.tenant IN ('', t.tenant)
                              AND greatest(p.until, p.held_until) > now())
                        AND NOT EXISTS (SELECT 1 FROM oncegate_rate_buckets b
                            WHERE b.type = $1 AND b.destination = d.destination
                              AND b.tat > now() + make_interval(secs => (b.burst - 1) / b.per_second)) AS open) f)
                    UNION ALL
                    SELECT d.destination, f.open, names.found + f.open::integer, names.n + 1
                    FROM names
                    CROSS JOIN LATERAL (SELECT (SELECT o.destination FROM oncegate_outbox o
                            WHERE o.type = $1 AND o.tenant = t.tenant AND o.destination > names.destination
                            ORDER BY o.destination LIMIT 1) AS destination) d
                    CROSS JOIN LATERAL (SELECT NOT EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                            WHERE p.type = $1 AND p.destination = d.destination AND p.tenant IN ('', t.tenant)
                              AND greatest(p.until, p.held_until) > now())
                        AND NOT EXISTS (SELECT 1 FROM oncegate_rate_buckets b
                            WHERE b.type = $1 AND b.destination = d.destination
                              AND b.tat > now() + make_interval(secs => (b.burst - 1) / b.per_second)) AS open) f
                    WHERE names.destination IS NOT NULL AND names.found < $2 AND names.n < 10000
                )
                SELECT names.destination FROM names WHERE names.destination IS NOT NULL AND names.open
            ) names
            WHERE held.yes
        )
        SELECT u.effect_id, u.destination, u.run_at, u.rescue
        FROM (
            SELECT fast.effect_id, fast.destination, fast.run_at, fast.rescue FROM fast
            UNION
            SELECT r.effect_id, r.destination, r.run_at, r.rescue
            FROM dests
            CROSS JOIN LATERAL (
                SELECT o.effect_id, o.destination, o.run_at,
                    coalesce(o.lease_expires_at > '-infinity'::timestamptz, false) AS rescue
                FROM oncegate_outbox o
                WHERE o.type = $1 AND o.tenant = t.tenant AND o.destination = dests.destination
                  AND o.run_at <= now()
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
                ORDER BY o.run_at
                LIMIT $2
            ) r
            UNION
            -- Rows that name no destination count as a destination of their own, never held back.
            SELECT n.effect_id, n.destination, n.run_at, n.rescue
            FROM held
            CROSS JOIN LATERAL (
                SELECT o.effect_id, o.destination, o.run_at,
                    coalesce(o.lease_expires_at > '-infinity'::timestamptz, false) AS rescue
                FROM oncegate_outbox o
                WHERE o.type = $1 AND o.tenant = t.tenant AND o.destination IS NULL
                  AND o.run_at <= now()
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
                -- By destination too: IS NULL does not tell the planner that the index's order is run_at's.
                ORDER BY o.destination, o.run_at
                LIMIT $2
            ) n
            WHERE held.yes
        ) u
        ORDER BY u.run_at
        LIMIT $2
    ) h
    WHERE t.tenant IS NOT NULL AND t.tenant <> ALL ($5::text[])
    UNION ALL
    SELECT h.effect_id, h.destination, h.run_at, h.rescue, row_number() OVER (ORDER BY h.run_at) AS k,
        random() AS draw
    FROM (SELECT o.effect_id, o.destination, o.run_at,
                coalesce(o.lease_expires_at > '-infinity'::timestamptz, false) AS rescue
          -- The first $2 × 8 due rows, as in claim.sql, whatever $5 (claim.sql says why).
          FROM (SELECT o.effect_id, o.run_at, o.destination, o.lease_expires_at
                FROM oncegate_outbox o
                WHERE o.type = $1 AND o.tenant IS NULL
                  AND o.run_at <= now()
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
                ORDER BY o.tenant, o.run_at
                LIMIT $2 * 8) o
          WHERE o.lease_expires_at > '-infinity'::timestamptz
            OR NOT EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                WHERE p.type = $1 AND p.destination = o.destination AND p.tenant = ''
                  AND greatest(p.until, p.held_until) > now())
            AND NOT EXISTS (SELECT 1 FROM oncegate_rate_buckets b
                WHERE b.type = $1 AND b.destination = o.destination
                  AND b.tat > now() + make_interval(secs => (b.burst - 1) / b.per_second))
          ORDER BY o.run_at
          LIMIT $2) h
), cand AS (
    SELECT heads.effect_id, heads.destination, heads.rescue, heads.k, heads.draw
    FROM heads
    WHERE NOT EXISTS (SELECT 1 FROM oncegate_paused_types p WHERE p.type = $1)
    ORDER BY heads.k, heads.draw
    LIMIT $2 * 4
), ranked AS (
    SELECT cand.effect_id, cand.rescue, cand.k, cand.draw,
        row_number() OVER (PARTITION BY cand.destination, cand.rescue ORDER BY cand.k, cand.draw) AS kd,
        coalesce((SELECT floor(extract(epoch FROM now() - greatest(b.tat, now()))::float8 * b.per_second + b.burst + 1e-9)
            FROM oncegate_rate_buckets b WHERE b.type = $1 AND b.destination = cand.destination), $6::integer) AS room
    FROM cand
), due AS (
    -- A probe of the primary key a row, in the round's order, and the update by it: claim.sql says why.
    SELECT o.effect_id, o.rescued, o.prev_owner, o.prev_token, o.prev_expires
    -- A rescue takes no room: it is decided on before any call, which then takes its token.
    FROM (SELECT ranked.effect_id FROM ranked WHERE ranked.kd <= ranked.room OR ranked.rescue
          ORDER BY ranked.k, ranked.draw) h
    CROSS JOIN LATERAL (
        SELECT o.effect_id, o.lease_expires_at IS NOT NULL AS rescued, o.lease_owner AS prev_owner,
            o.lease_token AS prev_token, o.lease_expires_at AS prev_expires
        FROM oncegate_outbox o
        WHERE o.effect_id = h.effect_id
          AND o.run_at <= now()
          AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
        FOR UPDATE SKIP LOCKED
    ) o
    LIMIT $2
), claimed AS (
    UPDATE oncegate_outbox o
    SET lease_token = gen_random_uuid(),
        lease_owner = $3,
        lease_expires_at = now() + make_interval(secs => $4::double precision / 1000),
        -- A lease that ran out is an interrupted attempt (migration 00027); one handed back after its rescue
        -- ('-infinity', hand_back.sql) was counted when it was rescued.
        interrupted = o.interrupted + CASE WHEN due.prev_expires > '-infinity' THEN 1 ELSE 0 END
    FROM due
    WHERE o.effect_id = ANY (ARRAY(SELECT due.effect_id FROM due)) AND o.effect_id = due.effect_id
    RETURNING o.effect_id, o.lease_token, due.rescued, o.tenant, o.type, o.trace, due.prev_owner, due.prev_token,
        due.prev_expires, o.interrupted
)
-- No effect is read here: claim.sql says why.
SELECT claimed.effect_id, claimed.lease_token, claimed.rescued, claimed.tenant, claimed.type, claimed.trace,
    claimed.prev_owner, claimed.prev_token, claimed.prev_expires, claimed.interrupted,
    (SELECT jsonb_agg(jsonb_build_array(p.tenant, p.destination,
            -- Past its end, a pause holds its rows while its probe is out (migration
            -- 00030): asked again a second later at most.
            ceil(extract(epoch FROM CASE WHEN p.until > now() THEN p.until
                ELSE least(p.held_until, now() + interval '1 second') END - now()) * 1000)::bigint))
     FROM oncegate_destination_pauses p
     WHERE p.type = $1 AND greatest(p.until, p.held_until) > now()
       AND (p.tenant = '' OR p.tenant IN (SELECT c.tenant FROM claimed c))) AS paused
FROM claimed
