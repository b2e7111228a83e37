-- The fleet's partition settings (migration 00029), as the first manager recorded them or a later one took
-- them over: what every gateway's requests write their keys' expiry and bodies by (partitions.Fleet). No row
-- before any manager has run.
SELECT settings FROM oncegate_partition_settings WHERE one
