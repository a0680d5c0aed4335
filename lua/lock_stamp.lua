-- lock_stamp.lua: copy the holder of a sale's lock into another bucket of the sale, whose
-- owner-checked scripts check the stamp as they check the lock (docs/invariants.md,
-- "Bucketed sales", "The lock in every bucket"). A stamp of a newer token is never replaced
-- by an older one.
--
-- KEYS[1] the stamp (the bucket's `lock` key)
-- ARGV[1] owner   ARGV[2] lease ms   ARGV[3] fencing token
--
-- Returns:
local NEWER_HOLDER = 0 -- a newer holder's stamp is there; nothing changed
local STAMPED = 1
local held = redis.call('HGET', KEYS[1], 'token')
if held and tonumber(held) > tonumber(ARGV[3]) then return NEWER_HOLDER end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[1], 1, 'token', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return STAMPED
