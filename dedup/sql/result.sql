-- How an effect's stored answer is read, in place of the {{result}} placeholder of columns.sql. An effect
-- with neither payload column set keeps its body in oncegate_effect_bodies (retention.payloads, migration
-- 00025): its answer is read there, by the effect id (one partition). Any other effect has it in its row,
-- and the bodies are not probed. Through a function (migration 00026), called only for such an effect: a
-- subquery here would open an index scan on every partition of the bodies as each statement starts.
CASE WHEN payload IS NULL AND legacy_payload IS NULL
    THEN oncegate_body_result(id) ELSE result END AS result
