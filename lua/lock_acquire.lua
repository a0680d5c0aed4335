-- lock_acquire.lua: take an activity's admin lock and issue its fencing token, or re-enter it.
--
-- The lock is a hash with a lease (PX), as Redisson's re-entrant lock: the holder's owner
-- field counts its holds, and the `token` field keeps the token its outermost acquisition got
-- (owners are UUIDs, so no owner field is ever called `token`). A re-entry by the holder adds
-- a hold, refreshes the lease and answers that same token: one token per outermost
-- acquisition, so the database's fencing check sees one holder, not one per hold.
--
-- The token comes from a counter of the same hash tag, floored by the highest token the
-- database has seen (ARGV[3]): if Redis lost the counter (failover, flush) the next token is
-- still higher than every token the database ever accepted, so fencing never goes backwards.
--
-- KEYS[1] lock    KEYS[2] fence counter      (same {<activityId>} hash tag)
-- ARGV[1] owner (unique per outermost acquisition)   ARGV[2] lease in ms
-- ARGV[3] DB's highest token   ARGV[4] optional: 'reenter' = only add a hold to a lock this
--         owner holds, never take a free one (a holder whose lease ran out must not come
--         back with its old token)
--
-- Returns the fencing token (>= 1): a new one when the lock was free, the outermost
-- acquisition's when the owner already held it (one more hold); 0 when someone else holds
-- the lock, or with 'reenter' when the owner holds it no longer (nothing changed).
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
if ARGV[4] == 'reenter' then return 0 end
local token = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if token <= floor then
  token = floor + 1
  redis.call('SET', KEYS[2], token)
end
redis.call('HSET', KEYS[1], ARGV[1], 1, 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
