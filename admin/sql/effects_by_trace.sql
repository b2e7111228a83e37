-- The effects of one trace, newest first, served by the partial trace_id index. $1 trace id, $2 limit
SELECT {{columns}} FROM oncegate_effects WHERE trace_id = $1 ORDER BY id DESC LIMIT $2
