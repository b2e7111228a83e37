-- Creates a partition of {{parent}} for [{{lower}}, {{upper}}) in one transaction (the statements are sent
-- together, with those of every partition the pass makes ahead, one implicit transaction: one wave of plans
-- made again, not one a table). CREATE TABLE ... PARTITION OF would take ACCESS EXCLUSIVE on the
-- parent, holding off every insert while it waits for its lock; a table created apart and attached takes
-- SHARE UPDATE EXCLUSIVE, which inserts do not wait for. The new table is empty, so the ATTACH's scan of it
-- is nothing, and it builds the parent's indexes on it, empty too. A partition must have its parent's CHECK
-- constraints to be attached; {{with}} is its storage parameters (the parent, partitioned, has none).
CREATE TABLE {{partition}} (LIKE {{parent}} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE) {{with}};
ALTER TABLE {{parent}} ATTACH PARTITION {{partition}} FOR VALUES FROM ({{lower}}) TO ({{upper}});
