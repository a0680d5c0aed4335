-- lock_release.lua: give back holds of the lock, only for its owner.
--
-- Each release takes one hold off the owner's count (see lock_acquire.lua); the lock goes
-- only when the count reaches 0, so a nested release never frees the lock its outer holder
-- still works under. Until then the lease is left as it is (the watchdog renews it). A holder
-- whose lease expired finds no field of its own and must not touch the lock the next holder
-- now owns.
--
-- KEYS[1] lock
-- ARGV[1] owner   ARGV[2] optional: holds to give back (default 1; an outermost release
--                 adds the nested holds that were dropped without their own release)
--
-- Returns 1 = released (the last hold: the lock is gone), 2 = a hold given back (the owner
-- still holds the lock), 0 = not the owner (nothing changed).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('HINCRBY', KEYS[1], ARGV[1], -tonumber(ARGV[2] or '1')) > 0 then return 2 end
redis.call('DEL', KEYS[1])
return 1
