-- The stalled-job sweeper. Any worker may call it; the guard key makes it run once per interval across all
-- of them, and because the guard is taken inside the script, two workers can never both pass it.
-- It reclaims the jobs of worker processes whose liveness ran out (a crash is seen within the liveness TTL,
-- whatever the lease TTL), then jobs whose own lease expired. A reclaimed job counts a stall, not an attempt;
-- past its max stalls it is dead with the reason recorded.
--
-- KEYS[1] guard  KEYS[2] jobs  KEYS[3] workers  KEYS[4] owned  KEYS[5] leases  KEYS[6] ready  KEYS[7] dead
-- KEYS[8] marker
-- ARGV[1] guard TTL ms (a little under the sweep interval)
-- ARGV[2] at most this many jobs reclaimed per call
-- Returns {-1} when another sweep ran within the interval, else {reclaimed, dead, workers lost}.

if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', tonumber(ARGV[1])) then
  return {-1}
end
local now = now_ms()
local limit = tonumber(ARGV[2])
local reclaimed, died, lost_workers = 0, 0, 0

-- owner, when given, must still hold the job: a tie left behind by a lost worker never reclaims a job that a
-- live worker leased since.
local function reclaim(id, why, owner)
  local job = load_job(KEYS[2], id)
  if not job or job.state ~= 'active' then
    redis.call('ZREM', KEYS[5], id)
    return
  end
  if owner and job.owner ~= owner then
    return
  end
  drop_lease(KEYS[5], KEYS[4], id, job)
  job.stalls = job.stalls + 1
  if job.stalls > job.max_stalls then
    make_dead(KEYS[2], KEYS[7], id, job, now,
      'stalled ' .. job.stalls .. ' times (max ' .. job.max_stalls .. '), last: ' .. why)
    died = died + 1
  else
    job.last_stall = why
    make_ready(KEYS[2], KEYS[6], id, job, now)
    reclaimed = reclaimed + 1
  end
end

local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
for _, wid in ipairs(gone) do
  local members = redis.call('ZRANGEBYLEX', KEYS[4], '[' .. wid .. ':', '[' .. wid .. ';', 'LIMIT', 0, limit)
  for _, m in ipairs(members) do
    reclaim(string.sub(m, #wid + 2), 'worker ' .. wid .. ' lost', wid)
    redis.call('ZREM', KEYS[4], m)
  end
  if #members < limit then
    redis.call('ZREM', KEYS[3], wid)
    lost_workers = lost_workers + 1
  end
end

local expired = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  reclaim(id, 'lease expired', nil)
end

if reclaimed > 0 then
  wake(KEYS[8])
end
return {reclaimed, died, lost_workers}
