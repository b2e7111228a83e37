-- How an effect's stored answer is read, in place of the {{result}} placeholder of columns.sql. An effect
-- with neither payload column set keeps its body in oncegate_effect_bodies (retention.payloads, migration
-- 00025): its answer is read there, by the effect id (one partition). Any other effect has it in its row,
-- and the bodies are not probed.
CASE WHEN payload IS NULL AND legacy_payload IS NULL
    THEN (SELECT b.result FROM oncegate_effect_bodies b WHERE b.effect_id = id) ELSE result END AS result
