-- A worker process's heartbeat: marks it seen alive and extends the leases of the runs it still holds. Every
-- run is checked against its epoch, so a worker learns within one beat exactly which run lost its lease.
--
-- KEYS[1] jobs  KEYS[2] leases  KEYS[3] workers
-- ARGV[1] worker id
-- ARGV[2] ms the worker counts as seen alive (for Stats)
-- ARGV[3] lease TTL ms
-- ARGV[4..] pairs of id, epoch
-- Returns the pairs {id, epoch, ...} whose lease the worker no longer holds.

local now = now_ms()
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local deadline = now + tonumber(ARGV[3])
local lost = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local job = load_job(KEYS[1], id)
  if holds(job, ARGV[i + 1]) and job.owner == ARGV[1] then
    redis.call('ZADD', KEYS[2], 'XX', deadline, id)
  else
    lost[#lost + 1] = id
    lost[#lost + 1] = ARGV[i + 1]
  end
end
return lost
