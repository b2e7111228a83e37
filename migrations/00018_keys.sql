-- +goose Up

-- Idempotency keys get a narrow table of their own, and it alone holds their uniqueness (issue 30). The unique
-- constraint on oncegate_effects (tenant, key) made a key free only when retention deleted its effect, so the
-- effects table could never be split by time (a unique constraint on a partitioned table must include the
-- partition key) and retention had to be a row-by-row DELETE. Now a create claims its key here, in the
-- statement that writes the effect (dedup/sql/insert.sql): the key names the effect it currently points at,
-- and a key whose expiry has passed and whose effect is terminal is claimed again by the same statement, for a
-- new effect under a new id and a new stable id. The old effect stays readable by its id until the purge
-- deletes it. Every reader of an effect by (tenant, key) goes through this table to the effect's id, so a
-- later oncegate_effects partitioned by time is read by id, and uniqueness never depends on it.
--
-- tenant leads the primary key, as Citus requires of a table distributed by tenant.
--
-- expires_at is when the key may be claimed again (once its effect is terminal): created + retention.keys,
-- counted from the creation, as Stripe counts its 24 hours. NULL is "not yet known": the keys backfilled here
-- from effects created before this migration, whose gateway's configured retention this SQL cannot know. A
-- NULL expiry is never past, so such a key is held, exactly as before, until the purge deletes its effect
-- (retention after the effect finished), and then it is free.
CREATE TABLE oncegate_keys (
    tenant      text        NOT NULL,
    key         text        NOT NULL,
    effect_id   bigint      NOT NULL,
    -- The fingerprint of the effect's request (as oncegate_effects.fingerprint), kept with the key so that a
    -- reused key can be told from a replay once effect data has its own, shorter retention (phase 2).
    fingerprint bytea       NOT NULL,
    expires_at  timestamptz
);

-- The backfill is offline-ish: it reads every effect and writes a key for each in this migration's
-- transaction, with writes to oncegate_effects held off (SHARE: reads, and so replays by older gateways, go
-- on) so that no effect is created without a key meanwhile. It takes as long as the table is large, and
-- gateways of the previous version cannot create effects after it (their ON CONFLICT names the constraint
-- dropped below): stop them before upgrading. Phase 2 of issue 30 brings the online, resumable upgrade, with
-- progress, under load.
LOCK TABLE oncegate_effects IN SHARE MODE;

-- Today's constraint held one effect per (tenant, key), so there is one key for each.
INSERT INTO oncegate_keys (tenant, key, effect_id, fingerprint, expires_at)
SELECT tenant, key, id, fingerprint, NULL FROM oncegate_effects;

-- Built after the backfill: one sort instead of an index insertion per row.
ALTER TABLE oncegate_keys ADD CONSTRAINT oncegate_keys_pkey PRIMARY KEY (tenant, key);

-- No reader looks effects up by (tenant, key) any more (they go through oncegate_keys), and a key claimed
-- again has two effects under it: the old one, until the purge, and the new one. `effect show KEY` without a
-- tenant, the key's LIKE search and the operator's listings use oncegate_effects_key_prefix.
ALTER TABLE oncegate_effects DROP CONSTRAINT oncegate_effects_tenant_key;
