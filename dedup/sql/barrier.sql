-- A durability barrier (00014): a write whose commit, under synchronous replication, returns only once a
-- synchronous standby has the WAL up to it, and so everything committed before it. $1 gateway, $2 slot
INSERT INTO oncegate_durability_barrier (gateway, slot, at) VALUES ($1, $2, now())
ON CONFLICT (gateway, slot) DO UPDATE SET at = EXCLUDED.at
