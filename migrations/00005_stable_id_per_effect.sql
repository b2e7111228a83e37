-- +goose Up

-- An idempotency key names a new effect once retention has purged the old one, and a new effect must reach
-- the world under a new id: a receiver that drops ids it has seen would drop the new webhook, a mail store
-- would file the new email under the old Message-ID, and the analytics insert skipped the new event because
-- the old row held its (tenant, key) (issue 13). The id was derived from tenant and key alone; now it is drawn
-- when the effect is created and kept here.
--
-- Rows created before this migration have none, and keep the id derived from tenant and key (Go's
-- effect.LegacyStableID), so a resend after the upgrade carries the id its receiver may have seen already.
-- Adding a nullable column changes only the catalogue.
ALTER TABLE oncegate_effects ADD COLUMN stable_id text;

-- An analytics event is unique per effect, not per key. Events recorded before this migration have no
-- effect_id (NULLs do not conflict); their effects are delivered and will not be inserted again.
ALTER TABLE analytics_events ADD COLUMN effect_id text;
ALTER TABLE analytics_events ADD CONSTRAINT analytics_events_effect_id_key UNIQUE (effect_id);
ALTER TABLE analytics_events DROP CONSTRAINT analytics_events_tenant_key_key;
