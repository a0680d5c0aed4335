-- lock_release.lua: give back the lock, or one nested hold of it, only for its owner.
--
-- The outermost holder's release ends the lock, whatever its hold count says: a re-entry
-- whose answer was lost, or a script delivered twice (as a cluster client may after a
-- dropped connection), can leave a hold its holder never knew of, and counting it down
-- would leave the lock behind until its lease ran out. A nested release gives one hold back
-- and never the last one, so the same release delivered twice cannot free the lock its outer
-- holder still works under. A holder whose lease expired finds no field of its own and must
-- not touch the lock the next holder now owns.
--
-- KEYS[1] lock
-- ARGV[1] owner   ARGV[2] "all" (the outermost release) or "one" (a nested release)
--
-- Returns 1 = released (the lock is gone), 2 = a nested hold given back (the owner still
-- holds the lock), 0 = not the owner (nothing changed). Any other mode, or none, is an error
-- and changes nothing: guessing one would either end a lock an outer holder still works
-- under or keep one its outermost holder thinks it gave back.
if ARGV[2] ~= 'all' and ARGV[2] ~= 'one' then
  return redis.error_reply('lock_release: mode must be "all" or "one"')
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if ARGV[2] == 'all' then
  redis.call('DEL', KEYS[1])
  return 1
end
if tonumber(redis.call('HGET', KEYS[1], ARGV[1])) > 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
return 2
