-- A worker process's heartbeat: refreshes its liveness and, when asked, extends the leases it still holds.
-- Every held job is checked against its epoch, so a worker learns within one beat that a lease was taken away.
--
-- KEYS[1] jobs  KEYS[2] leases  KEYS[3] workers
-- ARGV[1] worker id
-- ARGV[2] liveness TTL ms
-- ARGV[3] lease TTL ms, or 0 to check the leases without extending them
-- ARGV[4..] pairs of id, epoch
-- Returns the ids whose lease the worker no longer holds.

local now = now_ms()
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local extend = tonumber(ARGV[3])
local lost = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local job = load_job(KEYS[1], id)
  if holds(job, ARGV[i + 1]) and job.owner == ARGV[1] then
    if extend > 0 then
      redis.call('ZADD', KEYS[2], 'XX', now + extend, id)
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
