-- The effects that a queue job asked for (Oncegate-Job-Id), served by the job_id index. $1 job id, $2 limit
SELECT {{columns}} FROM oncegate_effects WHERE job_id = $1 ORDER BY id LIMIT $2
