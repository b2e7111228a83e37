-- Adds jobs, each unless a job with its ID exists in any state (ready, delayed, active, retained completed,
-- dead) or completed within the dedup window. Producers' concurrent enqueues are group-committed into one
-- call, so it takes many jobs; they are handled in order, so an ID twice in one call is added once and the
-- second is a duplicate of the first.
--
-- The hot path of every producer, so its cost per job is kept low: one HMGET and one ZMSCORE look every ID
-- up, one HSET per hash and one RPUSH / ZADD store every job added, whatever the batch size (a redis.call is
-- about a microsecond); the client encodes the record, leaving it open, and the script only appends the
-- fields Redis knows (its clock, the state), a suffix made once per call, so each job costs one new Lua
-- string; and an added job's record is not sent back, since the client has it and `now`.
-- The client caps a call at 512 jobs, well under Lua's limit of 8000 values to unpack.
--
-- KEYS[1] jobs      hash: id -> job record (JSON)
-- KEYS[2] payloads  hash: id -> payload
-- KEYS[3] ready     list of ids, oldest first
-- KEYS[4] delayed   zset: id -> run_at ms
-- KEYS[5] marker    zset that idle workers block on
-- KEYS[6] seen      zset: id -> finished_at ms of completed IDs (see complete.lua)
-- KEYS[7] sync      optional, given when the client WAITs for replicas after the call: a call that adds
--                   nothing writes Redis's clock here, so that the WAIT after it has a write of its own to
--                   wait for, later than the duplicates' first enqueue (made on another connection, perhaps
--                   not replicated yet), whether the server's WAIT counts every command or only writes
-- ARGV[1] dedup window ms (0 = off)
-- ARGV[2..] groups of four: id, job record (a JSON object without times or state, with epoch, failures and
--           stalls at 0, and without its closing brace), payload, delay ms (0 = ready now)
-- Returns {now, then three values per job}: 1, false, false when the job was added (its record is the one
-- sent with created_at = now, and ready_at = now or run_at = now + delay); 0, record, payload with the
-- existing job's record and payload when it was a duplicate. A duplicate of a completed job whose record is
-- no longer kept gets a record with only id, state and finished_at, and false for the payload.

local now = now_ms()
local now_s = string.format('%d', now)
local ready_tail = ',"created_at":' .. now_s .. ',"state":"ready","ready_at":' .. now_s .. '}'
local window = tonumber(ARGV[1])
local n = (#ARGV - 1) / 4

local ids = {}
for j = 1, n do
  ids[j] = ARGV[4 * j - 2]
end
local existing = redis.call('HMGET', KEYS[1], unpack(ids))
local finished = {}
if window > 0 then
  finished = redis.call('ZMSCORE', KEYS[6], unpack(ids))
end

local out = {now}
-- Jobs added by this call, by ID, so that a second copy of an ID is a duplicate of the first.
local added_record, added_payload = {}, {}
-- HSET and RPUSH / ZADD arguments, sent once for all the jobs added.
local records, payloads, ready, delayed = {}, {}, {}, {}
for j = 1, n do
  local a = 4 * j - 2
  local id = ARGV[a]
  -- complete.lua trims lazily, so an ID past the window may still be in the set.
  local fin = finished[j] and tonumber(finished[j])
  if existing[j] then
    out[#out + 1] = 0
    out[#out + 1] = existing[j]
    out[#out + 1] = redis.call('HGET', KEYS[2], id) or false
  elseif added_record[id] then
    out[#out + 1] = 0
    out[#out + 1] = added_record[id]
    out[#out + 1] = added_payload[id]
  elseif fin and fin > now - window then
    out[#out + 1] = 0
    out[#out + 1] = cjson.encode({id = id, state = 'completed', finished_at = fin})
    out[#out + 1] = false
  else
    local delay = tonumber(ARGV[a + 3])
    local raw
    if delay > 0 then
      raw = ARGV[a + 1] .. ',"created_at":' .. now_s .. ',"state":"delayed","run_at":' ..
        string.format('%d', now + delay) .. '}'
      delayed[#delayed + 1] = now + delay
      delayed[#delayed + 1] = id
    else
      raw = ARGV[a + 1] .. ready_tail
      ready[#ready + 1] = id
    end
    added_record[id], added_payload[id] = raw, ARGV[a + 2]
    records[#records + 1] = id
    records[#records + 1] = raw
    payloads[#payloads + 1] = id
    payloads[#payloads + 1] = ARGV[a + 2]
    out[#out + 1] = 1
    out[#out + 1] = false
    out[#out + 1] = false
  end
end

if #records > 0 then
  redis.call('HSET', KEYS[2], unpack(payloads))
  redis.call('HSET', KEYS[1], unpack(records))
end
local wake_now = false
if #delayed > 0 then
  redis.call('ZADD', KEYS[4], unpack(delayed))
  -- Wakes a worker that may be blocked until a later due time, so it learns of this earlier one.
  wake_now = true
end
-- Only a list that was empty can have idle workers waiting: whatever made the list non-empty woke one
-- already, and a worker that leaves jobs behind wakes the next.
if #ready > 0 and redis.call('RPUSH', KEYS[3], unpack(ready)) == #ready then
  wake_now = true
end
if wake_now then
  wake(KEYS[5])
end
if KEYS[7] and #records == 0 then
  redis.call('SET', KEYS[7], now_s)
end
return out
