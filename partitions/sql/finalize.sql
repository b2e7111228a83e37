-- Finishes a DETACH ... CONCURRENTLY that was interrupted: the partition was left pending detach.
ALTER TABLE {{parent}} DETACH PARTITION {{partition}} FINALIZE
