-- Adds a job unless a job with its ID exists in any state (ready, delayed, active, retained completed, dead).
--
-- KEYS[1] jobs      hash: id -> job record (JSON)
-- KEYS[2] payloads  hash: id -> payload
-- KEYS[3] ready     list of ids, oldest first
-- KEYS[4] delayed   zset: id -> run_at ms
-- KEYS[5] marker    zset that idle workers block on
-- ARGV[1] id
-- ARGV[2] job record (JSON) without times or state
-- ARGV[3] payload
-- ARGV[4] delay in ms (0 = ready now)
-- Returns {1, record} when the job was added, {0, record} with the existing job's record when the ID existed.

local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then
  return {0, existing}
end

local now = now_ms()
local job = cjson.decode(ARGV[2])
job.created_at = now
job.epoch = 0
job.failures = 0
job.stalls = 0
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])

local delay = tonumber(ARGV[4])
local raw
if delay > 0 then
  job.state = 'delayed'
  job.run_at = now + delay
  raw = save_job(KEYS[1], ARGV[1], job)
  redis.call('ZADD', KEYS[4], job.run_at, ARGV[1])
else
  job.state = 'ready'
  job.ready_at = now
  raw = save_job(KEYS[1], ARGV[1], job)
  redis.call('RPUSH', KEYS[3], ARGV[1])
end
-- A delayed job wakes a worker too, so that a worker blocked until a later due time learns of this earlier one.
wake(KEYS[5])
return {1, raw}
