-- The fleet's partition settings (migration 00029), as the first manager recorded them or a later one took
-- them over: what every gateway's requests write their keys' expiry and bodies by (partitions.Fleet). No row
-- before any manager has run.
-- With them, the settings before the last takeover (migration 00033) and when it was, by the database's clock.
SELECT settings, was, set_at, now() FROM oncegate_partition_settings WHERE one
