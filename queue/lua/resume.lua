-- An operator resumes a paused queue: the pause flag goes, and an idle worker is woken for the jobs that
-- waited (it wakes the next if it leaves ready jobs behind, see lease.lua).
--
-- KEYS[1] paused  KEYS[2] marker
-- Returns 1 if the queue was paused, 0 if it was not.

local was = redis.call('DEL', KEYS[1])
wake(KEYS[2])
return was
