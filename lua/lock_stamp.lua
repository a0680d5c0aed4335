-- lock_stamp.lua: copy the holder of a sale's lock into another bucket of the sale.
--
-- A bucketed sale's lock lives in bucket 0, but its other buckets lie on other slots, where
-- a script cannot read it. So the holder stamps each of them (owner -> 1, token -> its
-- fencing token, with the lock's lease) before it reads the database, and renews and releases
-- the stamps with the lock; the owner-checked scripts of a bucket (preheat.lua, adjust.lua,
-- fix_stock.lua, rebuild_users.lua, unload.lua) check the stamp as they check the lock. A
-- stamp of a newer token is never replaced by an older one, so a holder whose lease ran out
-- cannot take a bucket back from the next holder.
--
-- KEYS[1] the stamp (the bucket's `lock` key)
-- ARGV[1] owner   ARGV[2] lease ms   ARGV[3] fencing token
--
-- Returns 1 stamped, 0 a newer holder's stamp is there.
local held = redis.call('HGET', KEYS[1], 'token')
if held and tonumber(held) > tonumber(ARGV[3]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[1], 1, 'token', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
