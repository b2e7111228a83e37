-- Adds a job unless a job with its ID exists in any state (ready, delayed, active, retained completed, dead) or
-- completed within the dedup window.
-- The hot path of every producer, so it appends the fields only Redis knows (its clock, the state) to the
-- record the client encoded, rather than decoding and re-encoding it.
--
-- KEYS[1] jobs      hash: id -> job record (JSON)
-- KEYS[2] payloads  hash: id -> payload
-- KEYS[3] ready     list of ids, oldest first
-- KEYS[4] delayed   zset: id -> run_at ms
-- KEYS[5] marker    zset that idle workers block on
-- KEYS[6] seen      zset: id -> finished_at ms of completed IDs (see complete.lua)
-- ARGV[1] id
-- ARGV[2] job record (a JSON object) without times or state, with epoch, failures and stalls at 0
-- ARGV[3] payload
-- ARGV[4] delay in ms (0 = ready now)
-- ARGV[5] dedup window ms (0 = off)
-- Returns {1, record} when the job was added, {0, record} with the existing job's record when the ID existed.
-- A duplicate of a completed job whose record is no longer kept gets a record with only id, state and
-- finished_at.

local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then
  return {0, existing}
end

local now = now_ms()
local window = tonumber(ARGV[5])
if window > 0 then
  local finished = redis.call('ZSCORE', KEYS[6], ARGV[1])
  -- complete.lua trims lazily, so an ID past the window may still be in the set.
  if finished and tonumber(finished) > now - window then
    return {0, cjson.encode({id = ARGV[1], state = 'completed', finished_at = tonumber(finished)})}
  end
end

local delay = tonumber(ARGV[4])
local head = string.sub(ARGV[2], 1, -2) .. ',"created_at":' .. string.format('%d', now)
local raw
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if delay > 0 then
  raw = head .. ',"state":"delayed","run_at":' .. string.format('%d', now + delay) .. '}'
  redis.call('HSET', KEYS[1], ARGV[1], raw)
  redis.call('ZADD', KEYS[4], now + delay, ARGV[1])
  -- Wakes a worker that may be blocked until a later due time, so it learns of this earlier one.
  wake(KEYS[5])
else
  raw = head .. ',"state":"ready","ready_at":' .. string.format('%d', now) .. '}'
  redis.call('HSET', KEYS[1], ARGV[1], raw)
  -- Only an empty list can have idle workers waiting: whatever made the list non-empty woke one already, and
  -- a worker that leaves jobs behind wakes the next.
  if redis.call('RPUSH', KEYS[3], ARGV[1]) == 1 then
    wake(KEYS[5])
  end
end
return {1, raw}
