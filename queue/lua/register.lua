-- Registers a worker process's liveness connection: run by the worker over that connection each time it is
-- (re)connected. The sweeper treats a worker whose registered connection no longer exists as gone.
--
-- KEYS[1] conns    hash: worker id -> "<run id>:<client id>:<reconnect grace ms>"
-- KEYS[2] missing  hash: worker id -> ms its connection was first seen gone
-- KEYS[3] workers  zset: worker id -> seen-alive-until ms
-- ARGV[1] worker id
-- ARGV[2] CLIENT ID of the connection running this script
-- ARGV[3] ms the worker counts as seen alive
-- ARGV[4] the worker's reconnect grace ms: how long the sweeper waits for it after its connection closes
-- Returns the server's run id, or false when a newer connection of the worker is registered already.

local run_id = server_run_id()
local wid = ARGV[1]
local id = tonumber(ARGV[2])
local cur = redis.call('HGET', KEYS[1], wid)
if cur then
  -- Client ids grow within a server run: a registration that arrives late, from a connection that was
  -- replaced meanwhile, never overwrites the newer one.
  local cur_run, cur_id = split_reg(cur)
  if cur_run == run_id and cur_id and cur_id > id then
    return false
  end
end
redis.call('HSET', KEYS[1], wid, run_id .. ':' .. ARGV[2] .. ':' .. ARGV[4])
redis.call('HDEL', KEYS[2], wid)
redis.call('ZADD', KEYS[3], now_ms() + tonumber(ARGV[3]), wid)
return run_id
