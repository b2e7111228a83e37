-- The second half of a sweep (see sweep_begin.lua), run by the worker that passed the guard. It takes back
-- the jobs of worker processes that are gone, then jobs whose own lease expired. A reclaimed job counts a
-- stall, not an attempt; past its max stalls it is dead with the reason recorded.
--
-- A worker is gone when its registered liveness connection no longer exists on this server (the caller
-- asked CLIENT LIST) and it has not registered a new one within the reconnect grace: a process that exits
-- closes its sockets at once, while one that is frozen or slow keeps them. A registration made on another
-- server run (before a restart or failover) gets the longer restart grace, counted from when this server was
-- first seen, so that live workers can reconnect before anything is taken from them.
--
-- A sweep that follows a gap longer than outage_after (Redis stalled, every sweeping process paused), or the
-- first sweep of a queue, holds off lease expiry for outage_grace: leases that ran out while nobody could heartbeat or sweep are not held
-- against live workers, which get time to heartbeat first.
--
-- KEYS[1] jobs  KEYS[2] owned  KEYS[3] leases  KEYS[4] ready  KEYS[5] dead  KEYS[6] marker  KEYS[7] workers
-- KEYS[8] conns  KEYS[9] missing  KEYS[10] sweeper
-- ARGV[1] reconnect grace ms, for registrations that do not carry their own
-- ARGV[2] restart grace ms
-- ARGV[3] outage_after ms
-- ARGV[4] outage_grace ms
-- ARGV[5] at most this many jobs reclaimed per worker and per step
-- ARGV[6..] pairs of worker id, registration whose connection the caller found gone (or from another run)
-- Returns {reclaimed, dead, workers lost, gap ms when it was an outage (else 0), 1 when the limit left work for
-- another call at once}.

local now = now_ms()
local grace = tonumber(ARGV[1])
local restart_grace = tonumber(ARGV[2])
local limit = tonumber(ARGV[5])
local reclaimed, died, lost_workers, outage, more = 0, 0, 0, 0, 0

local run_id = server_run_id()
if redis.call('HGET', KEYS[10], 'run_id') ~= run_id then
  redis.call('HSET', KEYS[10], 'run_id', run_id, 'since', now)
end
local since = tonumber(redis.call('HGET', KEYS[10], 'since'))
local last = tonumber(redis.call('HGET', KEYS[10], 'last'))
redis.call('HSET', KEYS[10], 'last', now)
-- No previous sweep (a new queue, or state lost) says nothing about what happened before: hold as after an
-- outage of unknown length.
if not last or now - last > tonumber(ARGV[3]) then
  outage = last and now - last or 0
  redis.call('HSET', KEYS[10], 'hold_until', now + tonumber(ARGV[4]))
end

-- owner, when given, must still hold the job: a tie left behind by a lost worker never reclaims a job that a
-- live worker leased since.
local function reclaim(id, why, owner)
  local raw = redis.call('HGET', KEYS[1], id)
  local job = raw and decode_job(raw)
  if raw and not job then
    redis.call('ZREM', KEYS[3], id)
    bury_unreadable(KEYS[1], KEYS[5], id, raw, now)
    died = died + 1
    return
  end
  if not job or job.state ~= 'active' then
    redis.call('ZREM', KEYS[3], id)
    return
  end
  if owner and job.owner ~= owner then
    return
  end
  drop_lease(KEYS[3], KEYS[2], id, job)
  job.stalls = job.stalls + 1
  -- Set on the way to dead too, so that the last stall a job shows is the one that buried it.
  job.last_stall = why
  if job.stalls > job.max_stalls then
    make_dead(KEYS[1], KEYS[5], id, job, now,
      'stalled ' .. job.stalls .. ' times (max ' .. job.max_stalls .. '), last: ' .. why)
    died = died + 1
  else
    make_ready_front(KEYS[1], KEYS[4], id, job)
    reclaimed = reclaimed + 1
  end
end

local function forget_worker(wid)
  redis.call('HDEL', KEYS[8], wid)
  redis.call('HDEL', KEYS[9], wid)
  redis.call('ZREM', KEYS[7], wid)
end

for i = 6, #ARGV, 2 do
  local wid, reg = ARGV[i], ARGV[i + 1]
  -- A registration that changed since the caller looked is a reconnect: the worker is alive.
  if redis.call('HGET', KEYS[8], wid) == reg then
    local gone, why = false, nil
    local reg_run, _, reg_grace = split_reg(reg)
    if reg_run ~= run_id then
      gone = now - since >= restart_grace
      why = 'did not reconnect after the Redis server changed'
    else
      local first = tonumber(redis.call('HGET', KEYS[9], wid))
      if not first then
        redis.call('HSET', KEYS[9], wid, now)
      elseif now - first >= (reg_grace or grace) then
        gone = true
        why = 'connection closed'
      end
    end
    if gone then
      local members = redis.call('ZRANGEBYLEX', KEYS[2], '[' .. wid .. ':', '[' .. wid .. ';', 'LIMIT', 0, limit)
      for _, m in ipairs(members) do
        reclaim(string.sub(m, #wid + 2), 'worker ' .. wid .. ' lost: ' .. why, wid)
        redis.call('ZREM', KEYS[2], m)
      end
      if #members < limit then
        forget_worker(wid)
        lost_workers = lost_workers + 1
      else
        more = 1
      end
    end
  end
end

local hold_until = tonumber(redis.call('HGET', KEYS[10], 'hold_until'))
if not hold_until or now >= hold_until then
  local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    reclaim(id, 'lease expired', nil)
  end
  if #expired == limit then
    more = 1
  end
end

-- Workers not seen for a day (where connections cannot be checked, nothing else removes them) are forgotten.
for _, wid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now - 86400000, 'LIMIT', 0, 100)) do
  forget_worker(wid)
end

if reclaimed > 0 then
  wake(KEYS[6])
end
return {reclaimed, died, lost_workers, outage, more}
