-- Marks leased jobs completed, each only under its current epoch, then trims retained completed jobs by age
-- and count. Batched: one call completes many jobs, which is where the queue's throughput comes from.
-- Every completed ID is also remembered in `seen` for the dedup window, whether or not its record is kept:
-- the retention count can bury a record within a second, the window must hold for hours.
--
-- KEYS[1] jobs  KEYS[2] payloads  KEYS[3] leases  KEYS[4] owned
-- KEYS[5] done   zset: id -> finished_at ms, the retained completed jobs
-- KEYS[6] seen   zset: id -> finished_at ms, the completed IDs inside the dedup window
-- KEYS[7] epoch floor  raised to the highest epoch completed here: the record goes, now or when trimmed,
--                 and a job enqueued again under its ID starts above it (lease.lua)
-- ARGV[1] keep at most this many completed jobs (0 = delete at once)
-- ARGV[2] keep completed jobs this many ms
-- ARGV[3] dedup window ms (0 = off: remember nothing, and forget what was remembered)
-- ARGV[4..] pairs of id, epoch
-- Returns one integer per pair: 1 completed, 0 lease lost.

local now = now_ms()
local keep_count = tonumber(ARGV[1])
local keep_ms = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local out = {}
local top = 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local job = load_job(KEYS[1], id)
  if holds(job, ARGV[i + 1]) then
    drop_lease(KEYS[3], KEYS[4], id, job)
    top = math.max(top, tonumber(job.epoch))
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
    if window > 0 then
      redis.call('ZADD', KEYS[6], now, id)
    end
    out[#out + 1] = 1
  elseif job and job.state == 'completed' and tonumber(job.epoch) == tonumber(ARGV[i + 1]) then
    -- This epoch completed it already: a call repeated after its answer was lost.
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end

if top > 0 and top > tonumber(redis.call('GET', KEYS[7]) or '0') then
  redis.call('SET', KEYS[7], top)
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
-- Ordered by score, so the IDs past the window are the lowest ranks: counted and cut without reading them.
-- At most 500 per call, so a window shortened by a redeploy is caught up over several calls; each call adds
-- fewer than that.
local stale = redis.call('ZCOUNT', KEYS[6], '-inf', now - window)
if stale > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[6], 0, math.min(stale, 500) - 1)
end
return out
