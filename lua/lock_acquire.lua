-- lock_acquire.lua: take an activity's admin lock and issue its fencing token.
--
-- The token comes from a counter of the same hash tag, floored by the highest token the
-- database has seen (ARGV[3]): if Redis lost the counter (failover, flush) the next token is
-- still higher than every token the database ever accepted, so fencing never goes backwards.
--
-- KEYS[1] lock    KEYS[2] fence counter      (same {<activityId>} hash tag)
-- ARGV[1] owner (unique per attempt)   ARGV[2] lease in ms   ARGV[3] DB's highest token
--
-- Returns the fencing token (>= 1) when acquired, 0 when someone else holds the lock.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local token = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if token <= floor then
  token = floor + 1
  redis.call('SET', KEYS[2], token)
end
return token
