-- A graceful close: hands a worker's unfinished jobs back to ready at once, so nobody waits for their lease
-- to expire (those it names, and, as it leaves, those leased to it whose answer it never had), and removes the
-- worker from the liveness registry, so that its closing connection is not mistaken for a crash. Neither an
-- attempt nor a stall is counted.
--
-- KEYS[1] jobs  KEYS[2] leases  KEYS[3] owned  KEYS[4] ready  KEYS[5] marker  KEYS[6] workers
-- KEYS[7] conns  KEYS[8] missing
-- ARGV[1] worker id
-- ARGV[2] "1" to leave the registry (a close), "0" to stay (a worker handing back runs it gave up)
-- ARGV[3..] pairs of id, epoch
-- Returns the number of jobs handed back.

local now = now_ms()
local n = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local job = load_job(KEYS[1], id)
  if holds(job, ARGV[i + 1]) then
    drop_lease(KEYS[2], KEYS[3], id, job)
    make_ready_front(KEYS[1], KEYS[4], id, job)
    n = n + 1
  end
end
if ARGV[2] == '1' then
  -- A worker that leaves has no lease call out: a lease of its own that it did not name above is one whose
  -- answer never reached it (a dropped connection, a failover). It goes back too, rather than wait out its
  -- lease and count a stall.
  n = n + hand_back_unknown(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], {}, nil)
  redis.call('ZREM', KEYS[6], ARGV[1])
  redis.call('HDEL', KEYS[7], ARGV[1])
  redis.call('HDEL', KEYS[8], ARGV[1])
end
if n > 0 then
  wake(KEYS[5])
end
return n
