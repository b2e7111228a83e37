-- Marks leased jobs completed, each only under its current epoch, then trims retained completed jobs by age
-- and count. Batched: one call completes many jobs, which is where the queue's throughput comes from.
--
-- KEYS[1] jobs  KEYS[2] payloads  KEYS[3] leases  KEYS[4] owned
-- KEYS[5] done   zset: id -> finished_at ms, the retained completed jobs
-- ARGV[1] keep at most this many completed jobs (0 = delete at once)
-- ARGV[2] keep completed jobs this many ms
-- ARGV[3..] pairs of id, epoch
-- Returns one integer per pair: 1 completed, 0 lease lost.

local now = now_ms()
local keep_count = tonumber(ARGV[1])
local keep_ms = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local job = load_job(KEYS[1], id)
  if holds(job, ARGV[i + 1]) then
    drop_lease(KEYS[3], KEYS[4], id, job)
    if keep_count > 0 and keep_ms > 0 then
      job.state = 'completed'
      job.finished_at = now
      job.owner = nil
      save_job(KEYS[1], id, job)
      redis.call('ZADD', KEYS[5], now, id)
    else
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
    end
    out[#out + 1] = 1
  elseif job and job.state == 'completed' and tonumber(job.epoch) == tonumber(ARGV[i + 1]) then
    -- This epoch completed it already: a call repeated after its answer was lost.
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end

local function forget(ids)
  for _, id in ipairs(ids) do
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
  end
end
-- Bounded work per call: a backlog of expired completions is trimmed over several calls.
forget(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - keep_ms, 'LIMIT', 0, 500))
local excess = redis.call('ZCARD', KEYS[5]) - keep_count
if excess > 0 then
  forget(redis.call('ZRANGE', KEYS[5], 0, math.min(excess, 500) - 1))
end
return out
