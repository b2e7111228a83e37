-- A worker process's heartbeat: marks it seen alive and extends the leases of the runs it still holds. Every
-- run is checked against its epoch, so a worker learns within one beat exactly which run lost its lease.
--
-- It also hands back jobs leased to this worker that it does not know it holds: a lease whose answer was lost
-- on the way (a timeout, a dropped connection) would otherwise sit idle until its lease ran out, and count a
-- stall. The worker's fetcher leases one call at a time, and Redis numbers each call after the ones before it, so
-- a lease of this worker's made by an earlier call than the last one whose answer the worker registered
-- (ARGV[4], a lease call number) can only be one whose answer was lost. A slow answer still on its way, from a
-- call out as the beat is sent, has a number above it and is never taken for one. That holds while the
-- counter has reached the worker's number: a failover that lost the counter's last increments numbers the next
-- calls again from below it, and until the worker has an answer from one of them no lease is taken for lost.
--
-- KEYS[1] jobs  KEYS[2] leases  KEYS[3] workers  KEYS[4] owned  KEYS[5] ready  KEYS[6] marker
-- KEYS[7] leaseseq  the lease calls' counter (lease.lua)
-- ARGV[1] worker id
-- ARGV[2] ms the worker counts as seen alive (for Stats)
-- ARGV[3] lease TTL ms
-- ARGV[4] hand back this worker's unknown leases made by lease calls numbered below this; 0 = none
-- ARGV[5..] pairs of id, epoch
-- Returns {orphans handed back, id, epoch, ...}: the pairs whose lease the worker no longer holds.

local now = now_ms()
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local deadline = now + tonumber(ARGV[3])
local lost = {'0'}
local held = {}
for i = 5, #ARGV, 2 do
  local id = ARGV[i]
  held[id] = true
  local job = load_job(KEYS[1], id)
  if holds(job, ARGV[i + 1]) and job.owner == ARGV[1] then
    redis.call('ZADD', KEYS[2], 'XX', deadline, id)
  else
    lost[#lost + 1] = id
    lost[#lost + 1] = ARGV[i + 1]
  end
end
local wid = ARGV[1]
local before = tonumber(ARGV[4])
if before > 0 and (tonumber(redis.call('GET', KEYS[7])) or 0) < before then
  before = 0
end
local orphans = hand_back_unknown(KEYS[1], KEYS[2], KEYS[4], KEYS[5], wid, held, before)
if orphans > 0 then
  lost[1] = tostring(orphans)
  wake(KEYS[6])
end
return lost
