-- Whether the effect in scope (its id) has its outbox row under a lease: held now, or run out with its holder
-- (the next claim rescues it), or handed back after a rescue ('-infinity', release.sql). `id` is the effect's:
-- the outbox has no column of that name.
EXISTS (SELECT FROM oncegate_outbox o WHERE o.effect_id = id AND o.lease_expires_at IS NOT NULL)
