-- lock_renew.lua: extend the lease, only for its owner (the watchdog calls it every ttl/3).
--
-- The owner's hold count (see lock_acquire.lua) is left as it is: renewing is not a hold.
--
-- KEYS[1] lock
-- ARGV[1] owner   ARGV[2] lease in ms
--
-- Returns 1 = renewed, 0 = not the owner any more (lease expired and maybe taken): stop work.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
