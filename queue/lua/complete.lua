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
local retain = keep_count > 0 and keep_ms > 0
-- The score as text made once: Lua formats a number passed to a command with printf each time.
local now_text = string.format('%d', now)
local out = {}
local top = 0
-- The records are read in one call and the writes of every job made in one call each (batched in lib.lua):
-- a script pays for each command it calls, and a batch completes up to 256 jobs.
local ids = {}
for i = 4, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
end
local raws = hmget_all(KEYS[1], ids)
local leases, owned, gone, saved, done, seen = {}, {}, {}, {}, {}, {}
-- An ID twice in one batch is answered as if its first completion had been written before the second was
-- read, as when the two came in separate calls.
local finished = {}
for n, id in ipairs(ids) do
  local epoch = ARGV[3 + 2 * n]
  local job = finished[id]
  if job == nil then
    job = raws[n] and decode_record(raws[n]) or false
  elseif not retain then
    job = false
  end
  if finished[id] == nil and holds(job or nil, epoch) then
    leases[#leases + 1] = id
    if job.owner then
      owned[#owned + 1] = owned_member(job.owner, id)
    end
    top = math.max(top, tonumber(job.epoch))
    if retain then
      job.state = 'completed'
      job.finished_at = now
      job.owner = nil
      saved[#saved + 1] = id
      saved[#saved + 1] = cjson.encode(job)
      done[#done + 1] = now_text
      done[#done + 1] = id
    else
      gone[#gone + 1] = id
    end
    if window > 0 then
      seen[#seen + 1] = now_text
      seen[#seen + 1] = id
    end
    finished[id] = job
    out[#out + 1] = 1
  elseif job and job.state == 'completed' and tonumber(job.epoch) == tonumber(epoch) then
    -- This epoch completed it already: a call repeated after its answer was lost.
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
batched('ZREM', KEYS[3], leases, 1)
batched('ZREM', KEYS[4], owned, 1)
batched('HDEL', KEYS[1], gone, 1)
batched('HDEL', KEYS[2], gone, 1)
batched('HSET', KEYS[1], saved, 2)
batched('ZADD', KEYS[5], done, 2)
batched('ZADD', KEYS[6], seen, 2)

if top > 0 and top > epoch_floor(KEYS[7]) then
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
