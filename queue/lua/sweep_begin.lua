-- The first half of a sweep. Any worker may call it; the guard key lets one call per interval through, and
-- because the guard is taken inside the script, two workers never both pass it. It notes which Redis server
-- is running now (a restart or failover changes the run id) and hands back the registered liveness
-- connections, which the caller then looks up with CLIENT LIST ID (a command scripts may not run).
--
-- KEYS[1] guard  KEYS[2] sweeper  hash: run_id, since  KEYS[3] conns
-- ARGV[1] guard TTL ms (a little under the sweep interval)
-- Returns false when another sweep ran within the interval, else {run id, wid1, reg1, wid2, reg2, ...}.

if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', tonumber(ARGV[1])) then
  return false
end
local run_id = server_run_id()
if redis.call('HGET', KEYS[2], 'run_id') ~= run_id then
  redis.call('HSET', KEYS[2], 'run_id', run_id, 'since', now_ms())
end
local out = {run_id}
local regs = redis.call('HGETALL', KEYS[3])
for i = 1, #regs do
  out[#out + 1] = regs[i]
end
return out
