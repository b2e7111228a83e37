-- Deletes dead jobs for good, by id. Only jobs that are dead are touched; their IDs can be enqueued again.
--
-- KEYS[1] jobs  KEYS[2] payloads  KEYS[3] dead
-- ARGV[1..] ids
-- Returns the number of jobs purged.

local n = 0
for _, id in ipairs(ARGV) do
  local job = load_job(KEYS[1], id)
  if job and job.state == 'dead' then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    n = n + 1
  end
end
return n
