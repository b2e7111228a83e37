-- Records a failed attempt of a leased job, under its current epoch: the job is retried (now, or after a delay
-- that the worker chose with backoff and jitter) or, when the error is permanent or attempts are used up, dead.
--
-- KEYS[1] jobs  KEYS[2] leases  KEYS[3] owned  KEYS[4] ready  KEYS[5] delayed
-- KEYS[6] dead   zset: id -> died at ms
-- KEYS[7] marker
-- ARGV[1] id
-- ARGV[2] epoch
-- ARGV[3] error text
-- ARGV[4] "1" when the error is permanent
-- ARGV[5] retry delay ms
-- Returns {outcome, record}: outcome is "lost" (record empty), "retry" or "dead".

local id = ARGV[1]
local job = load_job(KEYS[1], id)
if not holds(job, ARGV[2]) then
  -- This epoch's failure recorded already (a call repeated after its answer was lost): say what came of it.
  if job and tonumber(job.epoch) == tonumber(ARGV[2]) and job.last_error == ARGV[3] and job.state ~= 'active' then
    if job.state == 'dead' then
      return {'dead', cjson.encode(job)}
    end
    return {'retry', cjson.encode(job)}
  end
  return {'lost', ''}
end
local now = now_ms()
drop_lease(KEYS[2], KEYS[3], id, job)
job.failures = job.failures + 1
job.last_error = ARGV[3]

if ARGV[4] == '1' then
  make_dead(KEYS[1], KEYS[6], id, job, now, 'permanent error: ' .. ARGV[3])
  return {'dead', cjson.encode(job)}
end
if job.failures >= job.max_attempts then
  make_dead(KEYS[1], KEYS[6], id, job, now,
    'failed ' .. job.failures .. ' of ' .. job.max_attempts .. ' attempts: ' .. ARGV[3])
  return {'dead', cjson.encode(job)}
end

local delay = tonumber(ARGV[5])
if delay > 0 then
  job.state = 'delayed'
  job.run_at = now + delay
  job.owner = nil
  redis.call('ZADD', KEYS[5], job.run_at, id)
  save_job(KEYS[1], id, job)
else
  make_ready(KEYS[1], KEYS[4], id, job, now)
end
wake(KEYS[7])
return {'retry', cjson.encode(job)}
