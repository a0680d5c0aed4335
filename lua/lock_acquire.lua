-- lock_acquire.lua: take a sale's admin lock and issue its fencing token, or re-enter it.
-- The lock is a hash with a lease: the holder's owner field counts its holds, `token` keeps
-- the token of its outermost acquisition (a re-entry adds a hold and answers that token). A
-- new token is the counter's next, floored by the highest the database has seen (ARGV[3]),
-- so a counter Redis lost never makes fencing go backwards. See shared/src/protocol/lock.rs.
--
-- KEYS[1] lock    KEYS[2] fence counter      (same {<activityId>} hash tag)
-- ARGV[1] owner (unique per outermost acquisition)   ARGV[2] lease in ms
-- ARGV[3] the database's highest token   ARGV[4] optional: 'reenter' = only add a hold to a
--         lock this owner holds, never take a free one
--
-- Returns the fencing token (>= 1), or:
local BUSY = 0 -- someone else holds the lock, or with 'reenter' this owner no longer does
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return BUSY end
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
if ARGV[4] == 'reenter' then return BUSY end
local token = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if token <= floor then
  token = floor + 1
  redis.call('SET', KEYS[2], token)
end
redis.call('HSET', KEYS[1], ARGV[1], 1, 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
