-- Leases up to ARGV[2] ready jobs to one worker process, after moving due delayed jobs to ready. Each lease
-- increments the job's fencing epoch and puts a deadline in `leases`, so expired leases are found by score.
-- It also refreshes the worker's liveness: a worker that leases is alive.
--
-- KEYS[1] jobs      KEYS[2] payloads  KEYS[3] ready   KEYS[4] delayed
-- KEYS[5] leases    zset: id -> lease deadline ms
-- KEYS[6] owned     zset of "<wid>:<id>" (score 0), the jobs each worker process holds
-- KEYS[7] workers   zset: wid -> liveness deadline ms
-- KEYS[8] marker
-- KEYS[9] leaseseq  counter: numbers each lease call; the jobs it leases record it (see heartbeat.lua)
-- KEYS[10] paused   present while an operator has paused the queue: nothing is leased, and no idle worker is
--                   woken for the ready jobs (Queue.Resume wakes them)
-- KEYS[11] epoch floor  the highest epoch of the jobs that completed or were purged (complete.lua,
--                   purge_dead.lua): a job's first lease starts above it. An ID can be enqueued again once its
--                   job is gone, and a worker that lost that job's lease may still be running it: were the new
--                   job's epochs to start at 1 again, that worker's epoch would be the new job's, its late
--                   completion would complete the new job, and the gateway, which keeps the highest epoch it
--                   saw for a job ID, would refuse the new job's effects until its epochs passed the old ones.
-- KEYS[12] dead     where a ready job whose record is not a JSON object goes (bury_unreadable)
-- ARGV[1] worker id
-- ARGV[2] how many jobs at most
-- ARGV[3] lease TTL ms
-- ARGV[4] liveness TTL ms
-- Returns {now, next delayed run_at or -1, lease call number, id1, epoch1, record1, payload1, id2, ...}: the
-- worker registers its runs by id and epoch at once and decodes each record in the job's own goroutine.

local now = now_ms()
local wid = ARGV[1]

local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1000)
for _, id in ipairs(due) do
  local raw = redis.call('HGET', KEYS[1], id)
  local job = raw and decode_job(raw)
  -- Only a delayed job is made ready: an entry left for a job that is running, completed or dead (a hand
  -- edit) ran it again.
  if job and job.state == 'delayed' then
    make_ready(KEYS[1], KEYS[3], id, job, now)
  elseif raw and not job then
    bury_unreadable(KEYS[1], KEYS[12], id, raw, now)
  end
  redis.call('ZREM', KEYS[4], id)
end

redis.call('ZADD', KEYS[7], now + tonumber(ARGV[4]), wid)

local seq = redis.call('INCR', KEYS[9])
local out = {now, -1, seq}
local paused = redis.call('EXISTS', KEYS[10]) == 1
local ids = false
-- A call for no job leases none: the worker makes one to learn a lease call number (worker.go, inDoubt).
if not paused and tonumber(ARGV[2]) > 0 then
  ids = redis.call('LPOP', KEYS[3], tonumber(ARGV[2]))
end
if ids then
  -- Scores go to Redis as text made once: Lua formats a number passed to a command with printf each time,
  -- which was a tenth of Redis's time under load.
  local deadline = string.format('%d', now + tonumber(ARGV[3]))
  local floor -- read at the first new job: most calls lease none
  -- Read in one call and written in one call each (batched in lib.lua): a script pays for every command.
  local raws = hmget_all(KEYS[1], ids)
  local payloads = hmget_all(KEYS[2], ids)
  local saved, leases, owned = {}, {}, {}
  -- An ID the list held twice is leased once, as when each read saw the write before it.
  local taken = {}
  for n, id in ipairs(ids) do
    local job = not taken[id] and raws[n] and decode_record(raws[n])
    if job == nil then
      -- Popped from the list, it would be in no set: it goes to dead, and the jobs beside it are leased.
      bury_unreadable(KEYS[1], KEYS[12], id, raws[n], now)
      taken[id] = true
    end
    -- A ready id without a record was purged while it waited; there is nothing to run.
    if job and job.state == 'ready' and counter(job.epoch) >= max_epoch then
      bury_unreadable(KEYS[1], KEYS[12], id, raws[n], now, 'an epoch of ' .. tostring(job.epoch))
      taken[id] = true
      job = nil
    end
    if job and job.state == 'ready' then
      taken[id] = true
      -- A fraction of an epoch (a hand edit) never matched the whole one a worker is told.
      local epoch = counter(job.epoch)
      if epoch == 0 then
        floor = floor or epoch_floor(KEYS[11])
        epoch = floor
      end
      job.epoch = epoch + 1
      -- Runs count the leases, from 1: the epoch does not (a reused ID starts above its old job's epochs).
      job.runs = (tonumber(job.runs) or 0) + 1
      job.state = 'active'
      job.owner = wid
      job.leased_at = now
      job.lease_seq = seq
      local raw = cjson.encode(job)
      saved[#saved + 1] = id
      saved[#saved + 1] = raw
      leases[#leases + 1] = deadline
      leases[#leases + 1] = id
      owned[#owned + 1] = '0'
      owned[#owned + 1] = owned_member(wid, id)
      out[#out + 1] = id
      out[#out + 1] = job.epoch
      out[#out + 1] = raw
      out[#out + 1] = payloads[n] or ''
    end
  end
  batched('HSET', KEYS[1], saved, 2)
  batched('ZADD', KEYS[5], leases, 2)
  batched('ZADD', KEYS[6], owned, 2)
end

if not paused and redis.call('LLEN', KEYS[3]) > 0 then
  wake(KEYS[8])
end
local nxt = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if nxt[2] then
  out[2] = tonumber(nxt[2])
end
return out
