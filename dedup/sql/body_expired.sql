-- Whether an effect's body expired, in place of the {{body_expired}} placeholder of columns.sql: it was kept
-- apart (neither payload column set, result.sql) and its row of oncegate_effect_bodies is gone with its
-- partition (retention.payloads). Through a function, as result.sql says.
payload IS NULL AND legacy_payload IS NULL
    AND NOT oncegate_body_kept(id) AS body_expired
