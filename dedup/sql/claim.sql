-- Leases up to $2 due outbox rows of effect type $1 to dispatcher $3 for $4 milliseconds, in one statement, and
-- returns what delivering their effects needs. The effects' rows are read, not written: an effect whose outbox
-- row is leased reads as delivering (status.sql), and rewriting the row at every claim cost a new version of it
-- and an entry in each of its indexes (a tenth to a quarter of Postgres's CPU a delivery, issue 14).
-- SKIP LOCKED lets any number of dispatchers claim at once without waiting on each other or taking the same
-- row. A row whose lease expired is due again: its dispatcher died mid-delivery, and `rescued` tells the
-- caller that the attempt may have reached the provider.
-- Payloads are read by a statement of their own (read_payloads.sql), after these leases commit: see Claim.
-- So is what a delivery needs of the effect (its key, attempts, stable id): this statement reads no effect,
-- so that its plan, the costliest of the hot path, is not made again whenever a partition of the effects is
-- attached, detached or vacuumed (issue 30: a third of the planning of a retirement, in waves).
-- Claims go round the tenants with work (issue 31): the tenants with rows of the type are found by a loose
-- scan of oncegate_outbox_tenant_due (one index probe a tenant, never a read of any tenant's backlog), each
-- brings its oldest due rows, and the claim takes the first of every tenant, then the second of every tenant,
-- and so on. One tenant's backlog of 100,000 rows so takes one row of a claim's round while another tenant
-- has work, where ordering by due time alone put all of it first. Within a round the tenants go in an order
-- drawn at each claim, not oldest first: a busy dispatcher's claims mostly have room for a row or two (a
-- delivery ends, a claim fills its slot), and the tenant with the backlog always has the oldest head, so it
-- took every one-row claim while a quiet tenant's new effect waited (claim_limited.sql draws for its tokens
-- likewise). Rows without a tenant (written before it was kept) are one tenant of their own.
-- Rows of the tenants in $5 are left alone: they have their fair share of this type's deliveries in flight.
-- A type an operator paused (oncegate_paused_types) is not claimed at all: its rows wait, uncharged.
-- A rescued row brings the lease it is rescued from (prev_owner, prev_token), so that the rescue can record
-- the interrupted attempt against the gateway that made it.
-- Rows of a destination that asked every gateway to wait (oncegate_destination_pauses) are left alone, by the
-- destination each outbox row names: a paused destination's backlog taken first and handed back a few rows a
-- claim held another destination's rows for minutes (an outside test: 3 min 37 s behind 50,000). A tenant whose
-- first rows are all paused has its other destinations' rows found by destination, a probe each, not by
-- walking the paused backlog (an index probe a row, every claim while the pause lasted).
-- `paused` is the same on every row, and set only when a row names no destination: the destinations of the
-- type that asked every gateway to wait (a pause is its tenant's, or every tenant's: migration 00028), with the milliseconds left, by the database's clock, for the rows
-- that name no destination (written before it was
-- kept, or sent back by a retry), which the dispatcher hands back, uncharged, by the destination it reads
-- from their payloads; asked here, the pause costs unlimited types no statement of their own. It is set too when
-- a row is rescued: a lease that ran out is rescued even while its destination is paused, and the dispatcher
-- must know the pause to leave the destination uncalled.
WITH RECURSIVE tenants AS (
    (SELECT o.tenant FROM oncegate_outbox o WHERE o.type = $1 AND o.tenant IS NOT NULL ORDER BY o.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant FROM oncegate_outbox o WHERE o.type = $1 AND o.tenant > tenants.tenant
            ORDER BY o.tenant LIMIT 1)
    FROM tenants
    WHERE tenants.tenant IS NOT NULL
), heads AS (
    SELECT h.effect_id, h.run_at, row_number() OVER (PARTITION BY t.tenant ORDER BY h.run_at) AS k, random() AS draw
    FROM tenants t
    CROSS JOIN LATERAL (
        -- The tenant's first $2 rows of open (not paused) destinations among its first $2 × 8 due rows: the
        -- walk stops at the $2nd. They are one range of oncegate_outbox_tenant_due, (tenant, run_at) from
        -- (t, -infinity) to (t, now): written as `tenant = t`, the plan walked oncegate_outbox_due through
        -- every tenant's rows to find one tenant's, 30 to 140 ms a claim beside a backlog of 100,000.
        WITH fast AS (
            SELECT w.effect_id, w.run_at
            FROM (
                SELECT o.effect_id, o.run_at,
                    -- A lease that ran out (not one handed back, '-infinity') is rescued whatever the pause:
                    -- its gateway died, and the rescue counts the interrupted attempt, makes an
                    -- at_most_once effect unknown, and hands the rest back, uncharged, to wait out the pause
                    -- uncalled. Left out, such rows stayed delivering under the dead gateway for the pause.
                    o.lease_expires_at > '-infinity'::timestamptz
                    OR NOT EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                        WHERE p.type = $1 AND p.destination = o.destination AND p.tenant IN ('', o.tenant)
                          AND greatest(p.until, p.held_until) > now()) AS open
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
            -- name order, a probe each, which stops at the $2nd open one, or after 10,000 (claim_limited.sql).
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
                              AND greatest(p.until, p.held_until) > now()) AS open) f)
                    UNION ALL
                    SELECT d.destination, f.open, names.found + f.open::integer, names.n + 1
                    FROM names
                    CROSS JOIN LATERAL (SELECT (SELECT o.destination FROM oncegate_outbox o
                            WHERE o.type = $1 AND o.tenant = t.tenant AND o.destination > names.destination
                            ORDER BY o.destination LIMIT 1) AS destination) d
                    CROSS JOIN LATERAL (SELECT NOT EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                            WHERE p.type = $1 AND p.destination = d.destination AND p.tenant IN ('', t.tenant)
                              AND greatest(p.until, p.held_until) > now()) AS open) f
                    WHERE names.destination IS NOT NULL AND names.found < $2 AND names.n < 10000
                )
                SELECT names.destination FROM names WHERE names.destination IS NOT NULL AND names.open
            ) names
            WHERE held.yes
        )
        SELECT u.effect_id, u.run_at
        FROM (
            SELECT fast.effect_id, fast.run_at FROM fast
            UNION
            SELECT r.effect_id, r.run_at
            FROM dests
            CROSS JOIN LATERAL (
                SELECT o.effect_id, o.run_at
                FROM oncegate_outbox o
                WHERE o.type = $1 AND o.tenant = t.tenant AND o.destination = dests.destination
                  AND o.run_at <= now()
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
                ORDER BY o.destination, o.run_at
                LIMIT $2
            ) r
            UNION
            -- Rows that name no destination are never paused here (the dispatcher hands them back by their
            -- payload's destination).
            SELECT n.effect_id, n.run_at
            FROM held
            CROSS JOIN LATERAL (
                SELECT o.effect_id, o.run_at
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
    SELECT h.effect_id, h.run_at, row_number() OVER (ORDER BY h.run_at) AS k, random() AS draw
    FROM (SELECT o.effect_id, o.run_at
          -- The first $2 × 8 due rows, as a tenant's walk. Migration 00021 named the tenant of the rows
          -- written before 00016; these are a gateway's older than 00016, which cannot create effects in a
          -- database past 00018. Their tenant is not known here, so $5 does not leave them out: the
          -- dispatcher hands back, uncharged, the rows of a tenant that has its share in flight (asking each
          -- row's effect for its tenant put the effects, and every partition of them, in this plan).
          FROM (SELECT o.effect_id, o.run_at, o.destination
                FROM oncegate_outbox o
                WHERE o.type = $1 AND o.tenant IS NULL
                  AND o.run_at <= now()
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
                ORDER BY o.tenant, o.run_at
                LIMIT $2 * 8) o
          WHERE NOT EXISTS (SELECT 1 FROM oncegate_destination_pauses p
                WHERE p.type = $1 AND p.destination = o.destination AND p.tenant = ''
                  AND greatest(p.until, p.held_until) > now())
          ORDER BY o.run_at
          LIMIT $2) h
), due AS (
    -- Each head is locked by its own probe of the primary key, in the round's order, until $2 are locked: an
    -- outbox that went empty and was vacuumed keeps its pages with no row noted in them, and until the next
    -- ANALYZE a join left to the planner hashed every row of a burst (1.3 s a claim beside 100,000, in the
    -- fleet bench). A subquery with FOR UPDATE is never merged into the join, so it stays a probe per head.
    SELECT o.effect_id, o.rescued, o.prev_owner, o.prev_token, o.prev_expires
    FROM (SELECT heads.effect_id FROM heads ORDER BY heads.k, heads.draw) h
    CROSS JOIN LATERAL (
        SELECT o.effect_id, o.lease_expires_at IS NOT NULL AS rescued, o.lease_owner AS prev_owner,
            o.lease_token AS prev_token, o.lease_expires_at AS prev_expires
        FROM oncegate_outbox o
        WHERE o.effect_id = h.effect_id
          AND o.run_at <= now()
          AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
        FOR UPDATE SKIP LOCKED
    ) o
    WHERE NOT EXISTS (SELECT 1 FROM oncegate_paused_types p WHERE p.type = $1)
    LIMIT $2
), claimed AS (
    -- By the primary key, for the same reason: an update joined to due was planned as a read of the whole
    -- outbox.
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
        due.prev_expires, o.interrupted, o.destination
)
SELECT claimed.effect_id, claimed.lease_token, claimed.rescued, claimed.tenant, claimed.type, claimed.trace,
    claimed.prev_owner, claimed.prev_token, claimed.prev_expires, claimed.interrupted,
    -- Read only when a row names no destination, or is rescued (whatever its destination's pause): an outside
    -- test's 10,000 paused destinations, aggregated at every claim, cut the type's deliveries from 300 a
    -- second to 13 to 44.
    -- [tenant ('': every tenant), destination, ms left] of each pause of the claimed rows' tenants.
    (SELECT jsonb_agg(jsonb_build_array(p.tenant, p.destination,
            -- Past its end, a pause holds its rows while its probe is out (migration
            -- 00030): asked again a second later at most.
            ceil(extract(epoch FROM CASE WHEN p.until > now() THEN p.until
                ELSE least(p.held_until, now() + interval '1 second') END - now()) * 1000)::bigint))
     FROM oncegate_destination_pauses p
     WHERE p.type = $1 AND greatest(p.until, p.held_until) > now()
       AND (p.tenant = '' OR p.tenant IN (SELECT c.tenant FROM claimed c))
       AND EXISTS (SELECT 1 FROM claimed c WHERE c.destination IS NULL OR c.rescued)) AS paused
FROM claimed
