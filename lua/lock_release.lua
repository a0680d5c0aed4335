-- lock_release.lua: release the lock, only for its owner.
--
-- A holder whose lease expired must not delete the lock the next holder now owns.
--
-- KEYS[1] lock
-- ARGV[1] owner
--
-- Returns 1 = released, 0 = not the owner (nothing changed).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
