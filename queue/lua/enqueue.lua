-- Adds jobs, each unless a job with its ID exists in any state (ready, delayed, active, retained completed,
-- dead) or completed within the dedup window. Producers' concurrent enqueues are group-committed into one
-- call, so it takes many jobs; they are handled in order, so an ID twice in one call is added once and the
-- second is a duplicate of the first. The hot path of every producer, so it appends the fields only Redis
-- knows (its clock, the state) to the record the client encoded, rather than decoding and re-encoding it.
--
-- KEYS[1] jobs      hash: id -> job record (JSON)
-- KEYS[2] payloads  hash: id -> payload
-- KEYS[3] ready     list of ids, oldest first
-- KEYS[4] delayed   zset: id -> run_at ms
-- KEYS[5] marker    zset that idle workers block on
-- KEYS[6] seen      zset: id -> finished_at ms of completed IDs (see complete.lua)
-- ARGV[1] dedup window ms (0 = off)
-- ARGV[2..] groups of four: id, job record (a JSON object without times or state, with epoch, failures and
--           stalls at 0), payload, delay ms (0 = ready now)
-- Returns three values per job: 1 and the record when it was added, with false for the payload (the caller
-- has it); 0, the existing record and its payload when it was a duplicate. A duplicate of a completed job
-- whose record is no longer kept gets a record with only id, state and finished_at, and false for the payload.

local now = now_ms()
local now_s = string.format('%d', now)
local window = tonumber(ARGV[1])
local wake_now = false
local out = {}
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  local existing = redis.call('HGET', KEYS[1], id)
  local finished = nil
  if not existing and window > 0 then
    finished = redis.call('ZSCORE', KEYS[6], id)
    -- complete.lua trims lazily, so an ID past the window may still be in the set.
    if finished and tonumber(finished) <= now - window then
      finished = nil
    end
  end
  if existing then
    out[#out + 1] = 0
    out[#out + 1] = existing
    out[#out + 1] = redis.call('HGET', KEYS[2], id) or false
  elseif finished then
    out[#out + 1] = 0
    out[#out + 1] = cjson.encode({id = id, state = 'completed', finished_at = tonumber(finished)})
    out[#out + 1] = false
  else
    local delay = tonumber(ARGV[i + 3])
    local head = string.sub(ARGV[i + 1], 1, -2) .. ',"created_at":' .. now_s
    local raw
    redis.call('HSET', KEYS[2], id, ARGV[i + 2])
    if delay > 0 then
      raw = head .. ',"state":"delayed","run_at":' .. string.format('%d', now + delay) .. '}'
      redis.call('HSET', KEYS[1], id, raw)
      redis.call('ZADD', KEYS[4], now + delay, id)
      -- Wakes a worker that may be blocked until a later due time, so it learns of this earlier one.
      wake_now = true
    else
      raw = head .. ',"state":"ready","ready_at":' .. now_s .. '}'
      redis.call('HSET', KEYS[1], id, raw)
      -- Only an empty list can have idle workers waiting: whatever made the list non-empty woke one already,
      -- and a worker that leaves jobs behind wakes the next.
      if redis.call('RPUSH', KEYS[3], id) == 1 then
        wake_now = true
      end
    end
    out[#out + 1] = 1
    out[#out + 1] = raw
    out[#out + 1] = false
  end
end
if wake_now then
  wake(KEYS[5])
end
return out
