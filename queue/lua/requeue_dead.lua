-- An operator sends dead jobs back to ready with fresh attempt and stall counts. The last error stays on the
-- record for reference.
--
-- KEYS[1] jobs  KEYS[2] dead  KEYS[3] ready  KEYS[4] marker
-- ARGV[1..] ids
-- Returns the number of jobs requeued; ids that are not dead are left as they are.

local now = now_ms()
local n = 0
for _, id in ipairs(ARGV) do
  local job = load_job(KEYS[1], id)
  -- A record buried as unreadable (lib.lua) stays dead until an operator mends it: run as it is, it has no
  -- kind, no attempts and no epoch of its own.
  if job and job.state == 'dead' and job.unreadable_record == nil then
    redis.call('ZREM', KEYS[2], id)
    job.failures = 0
    job.stalls = 0
    job.dead_reason = nil
    job.finished_at = nil
    make_ready(KEYS[1], KEYS[3], id, job, now)
    n = n + 1
  end
end
if n > 0 then
  wake(KEYS[4])
end
return n
