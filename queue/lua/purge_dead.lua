-- Deletes dead jobs for good, by id. Only jobs that are dead are touched; their IDs can be enqueued again.
--
-- KEYS[1] jobs  KEYS[2] payloads  KEYS[3] dead
-- KEYS[4] epoch floor: raised to the highest epoch purged, which a job enqueued again under its ID starts
--         above (lease.lua)
-- ARGV[1..] ids
-- Returns the number of jobs purged.

local n = 0
local top = 0
for _, id in ipairs(ARGV) do
  local raw = redis.call('HGET', KEYS[1], id)
  local job = raw and decode_job(raw)
  -- A dead entry whose record no script can read, or that has none (hand edits), is purged too: nothing
  -- else can clear it.
  if (job and job.state == 'dead') or (not job and redis.call('ZSCORE', KEYS[3], id)) then
    job = job or {epoch = 0}
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    n = n + 1
    top = math.max(top, tonumber(job.epoch))
  end
end
if top > 0 and top > epoch_floor(KEYS[4]) then
  redis.call('SET', KEYS[4], top)
end
return n
