-- cancel_begin.lua: announce a cancellation in the ledger before the database commits it.
--
-- While the entry is there the ledger is not quiet, so reconcile will not "correct" Redis
-- stock from a database that is already ahead of Redis (which would hand the units out twice).
--
-- KEYS[1] meta   KEYS[2] ledger
-- ARGV[1] user id   ARGV[2] order id   ARGV[3] quantity   ARGV[4] now (ms)
--
-- Returns 1 = recorded (or already recorded for this order), 0 = the user has another entry
-- in flight (retry later), 2 = activity not loaded in Redis (nothing to give back there).
if redis.call('EXISTS', KEYS[1]) == 0 then return 2 end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v then
  local kind, id = string.match(v, '^(%a)|([^|]+)|')
  if kind == 'c' and id == ARGV[2] then return 1 end
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], 'c|' .. ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4])
return 1
