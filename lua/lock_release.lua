-- lock_release.lua: give back the lock, or one nested hold of it, only for its owner. The
-- outermost release ends the lock whatever its hold count says (a hold whose answer was lost
-- must not keep it); a nested release gives one hold back and never the last. Any mode but
-- "all" or "one" is an error and changes nothing. See shared/src/protocol/lock.rs.
--
-- KEYS[1] lock
-- ARGV[1] owner   ARGV[2] "all" (the outermost release) or "one" (a nested release)
--
-- Returns:
local NOT_OWNER = 0 -- nothing changed
local RELEASED = 1 -- the lock is gone
local HOLD_GIVEN_BACK = 2 -- a nested hold went back; the owner still holds the lock
if ARGV[2] ~= 'all' and ARGV[2] ~= 'one' then
  return redis.error_reply('lock_release: mode must be "all" or "one"')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return NOT_OWNER end
if ARGV[2] == 'all' then
  redis.call('DEL', KEYS[1])
  return RELEASED
end
if tonumber(redis.call('HGET', KEYS[1], ARGV[1])) > 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
return HOLD_GIVEN_BACK
