-- lock_renew.lua: extend the lease, only for its owner (the watchdog calls it every ttl/3);
-- the hold count is left as it is.
--
-- KEYS[1] lock
-- ARGV[1] owner   ARGV[2] lease in ms
--
-- Returns:
local LOST = 0 -- not the owner any more (the lease expired, maybe taken): stop work
local RENEWED = 1
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return RENEWED
end
return LOST
