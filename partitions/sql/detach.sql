-- Detaches a partition without holding off writes: its first transaction marks it pending detach, its
-- second waits for every transaction that may still see it, then removes it. Killed or timed out in the
-- second, it leaves the partition pending, which finalize.sql finishes. Cannot run in a transaction block,
-- nor on a table with a DEFAULT partition (this layout has none).
ALTER TABLE {{parent}} DETACH PARTITION {{partition}} CONCURRENTLY
