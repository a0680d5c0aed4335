-- unload.lua: remove a bucket's meta for the lock's owner, so no purchase runs on it until a
-- load from scratch rebuilds it: a bucketed sale is loaded whole (docs/invariants.md,
-- "Bucketed sales").
--
-- KEYS[1] meta   KEYS[2] lock (bucket 0's lock, or the lock's stamp in another bucket)
-- ARGV[1] owner
--
-- Returns:
local NOT_OWNER = 0
local UNLOADED = 1 -- now or before
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return NOT_OWNER end
redis.call('DEL', KEYS[1])
return UNLOADED
