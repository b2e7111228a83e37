-- Helpers shared by every script in this folder. scripts.go prepends this file to each script, so a script
-- reads as one unit in Redis (SCRIPT LOAD) while the helpers are written once.
--
-- A job's record is a JSON object in the queue's `jobs` hash (field = job ID); its payload sits apart in the
-- `payloads` hash so that state changes never rewrite the payload. All times are milliseconds of Redis's own
-- clock (TIME): worker clocks play no part in any deadline.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A whole number from whatever a field holds; nil when it holds none (a word, null, infinity).
local function whole(v)
  v = tonumber(v)
  if not v or v ~= v or v == math.huge or v == -math.huge then
    return nil
  end
  return math.floor(v)
end

local states = {ready = true, delayed = true, active = true, completed = true, dead = true}

-- Decodes a job's record, nil when it is not a JSON object: a script that stopped on one record midway would
-- keep the writes it made before (Redis undoes none). The two scripts every job passes through use this
-- alone; decode_job is for the rest.
local function decode_record(raw)
  local ok, job = pcall(cjson.decode, raw)
  -- A JSON array, an empty object or a record without a state of ours is no job a script can place: it was
  -- taken off the ready list and put nowhere.
  if ok and type(job) == 'table' and states[job.state] then
    return job
  end
  return nil
end

-- A record's counter as a whole number: a word, null or a number below 0 (a hand edit, another version) is
-- 0, a fraction is cut.
local function counter(v)
  if type(v) == 'number' and v % 1 == 0 and v >= 0 then
    return v
  end
  return math.max(whole(v) or 0, 0)
end

-- Epochs stay below this: cjson writes numbers with 14 significant digits, and an epoch it rounded never
-- matched the one the worker was told, so the job was leased again every second, never run.
local max_epoch = 1e13

local counters = {'epoch', 'runs', 'failures', 'stalls', 'max_attempts', 'max_stalls'}

-- decode_record, with the counters the scripts count and compare with read by counter(): a word among them
-- stopped fail.lua after it had dropped the lease, leaving the job active in no set.
local function decode_job(raw)
  local job = decode_record(raw)
  if job then
    for i = 1, #counters do
      job[counters[i]] = counter(job[counters[i]])
    end
    if type(job.owner) ~= 'string' then
      job.owner = nil
    end
  end
  return job
end

local function load_job(jobs_key, id)
  local raw = redis.call('HGET', jobs_key, id)
  if not raw then
    return nil
  end
  return decode_job(raw)
end

-- Sends a job whose record no script can place (not a JSON object, no state of ours, an epoch out of range)
-- to dead, with a record that says so and keeps the old one whole (unreadable_record), for an operator to
-- mend: it cannot be run, nor left where it was. requeue_dead.lua leaves it dead until it is mended.
local function bury_unreadable(keys_jobs, keys_dead, id, raw, now, why)
  local shown = string.sub(raw, 1, 100)
  redis.call('HSET', keys_jobs, id, cjson.encode({id = id, state = 'dead', epoch = 0, failures = 0, stalls = 0,
    max_attempts = 0, max_stalls = 0, finished_at = now, unreadable_record = raw,
    dead_reason = 'unreadable record (' .. (why or 'not a job record') .. '), kept in unreadable_record: ' ..
      shown}))
  redis.call('ZADD', keys_dead, now, id)
end

-- The epoch floor (see lease.lua) as a whole number, whatever a hand edit left in the key.
local function epoch_floor(key)
  return math.max(whole(redis.call('GET', key)) or 0, 0)
end

local function save_job(jobs_key, id, job)
  local raw = cjson.encode(job)
  redis.call('HSET', jobs_key, id, raw)
  return raw
end

-- Calls a variadic command (ZREM, HDEL, HSET, ZADD) once for many arguments rather than once for each: a
-- script pays for every command it calls. args is a flat list of groups of `per` (1 for members, 2 for
-- score/member or field/value pairs); the calls stay below Lua's limit on unpacked values.
local function batched(cmd, key, args, per)
  local chunk = 1000 * per
  for i = 1, #args, chunk do
    redis.call(cmd, key, unpack(args, i, math.min(i + chunk - 1, #args)))
  end
end

-- Reads many fields of a hash in calls of at most 1000: the values, in order, false where a field is absent.
local function hmget_all(key, fields)
  local out = {}
  for i = 1, #fields, 1000 do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(i + 999, #fields)))
    for j = 1, #part do
      out[#out + 1] = part[j]
    end
  end
  return out
end

-- Wakes one worker blocked in BZPOPMIN on the marker. The marker has a single member, so a burst of enqueues
-- wakes one worker, which wakes the next if it leaves ready jobs behind (see lease.lua).
local function wake(marker_key)
  redis.call('ZADD', marker_key, 0, 'm')
end

-- The member of `owned` that ties a job to the worker process holding it. Worker IDs have a fixed length, so
-- ZRANGEBYLEX on "[<wid>:" .. "[<wid>;" lists exactly that worker's jobs.
local function owned_member(wid, id)
  return wid .. ':' .. id
end

-- Puts a job at the tail of the ready list. The list stays ordered by ready_at, so its head is the oldest.
local function make_ready(keys_jobs, keys_ready, id, job, now)
  job.state = 'ready'
  job.ready_at = now
  job.owner = nil
  job.run_at = nil
  save_job(keys_jobs, id, job)
  redis.call('RPUSH', keys_ready, id)
end

-- Puts a job that was taken back from its worker (a stall, a graceful close) at the head of the ready list:
-- it had waited longest and was already running, so a crash must not send it behind the whole backlog. Its
-- ready_at is kept, which keeps the list ordered by ready_at.
local function make_ready_front(keys_jobs, keys_ready, id, job)
  job.state = 'ready'
  job.owner = nil
  job.run_at = nil
  save_job(keys_jobs, id, job)
  redis.call('LPUSH', keys_ready, id)
end

local function make_dead(keys_jobs, keys_dead, id, job, now, reason)
  job.state = 'dead'
  job.dead_reason = reason
  job.finished_at = now
  job.owner = nil
  job.run_at = nil
  save_job(keys_jobs, id, job)
  redis.call('ZADD', keys_dead, now, id)
end

-- Removes an active job's lease. The caller has checked that the job is active.
local function drop_lease(keys_leases, keys_owned, id, job)
  redis.call('ZREM', keys_leases, id)
  if job.owner then
    redis.call('ZREM', keys_owned, owned_member(job.owner, id))
  end
end

-- Hands back to the head of ready the jobs leased to worker wid that it does not hold (not in held, an id ->
-- true set) and that a lease call numbered below before made (nil: any): leases whose answer never reached the
-- worker. Returns how many.
local function hand_back_unknown(keys_jobs, keys_leases, keys_owned, keys_ready, wid, held, before)
  local n = 0
  for _, m in ipairs(redis.call('ZRANGEBYLEX', keys_owned, '[' .. wid .. ':', '[' .. wid .. ';', 'LIMIT', 0, 1000)) do
    local id = string.sub(m, #wid + 2)
    if not held[id] then
      local job = load_job(keys_jobs, id)
      if job and job.state == 'active' and job.owner == wid and
          (before == nil or (whole(job.lease_seq) or 0) < before) then
        drop_lease(keys_leases, keys_owned, id, job)
        make_ready_front(keys_jobs, keys_ready, id, job)
        n = n + 1
      end
    end
  end
  return n
end

-- The fence: a lease is the caller's only while the job is active under the epoch the caller was given.
local function holds(job, epoch)
  return job ~= nil and job.state == 'active' and counter(job.epoch) == tonumber(epoch)
end

-- The identity of the Redis server running the script. Client IDs are only unique within one server run, so a
-- liveness connection is recorded with the run id of the server that gave it its id: after a restart or a
-- failover, an old registration is recognised as such instead of matching an unrelated new connection. An ACL
-- may refuse INFO (it is in @dangerous): the queue then works on, without telling restarts apart.
local function server_run_id()
  local info = redis.pcall('INFO', 'server')
  if type(info) ~= 'string' then
    return 'unknown'
  end
  return string.match(info, 'run_id:(%w+)') or 'unknown'
end

-- Splits a registration "<run id>:<client id>:<reconnect grace ms>".
local function split_reg(reg)
  local run, id, grace = string.match(reg, '^(%w+):(%d+):(%d+)$')
  return run, tonumber(id), tonumber(grace)
end
