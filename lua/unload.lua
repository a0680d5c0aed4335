-- unload.lua: remove a bucket's meta for the lock's owner, so the bucket is not loaded (no
-- purchase runs on it) until a load from scratch rebuilds it. A bucketed sale is loaded
-- whole: when Redis lost one bucket (a shard restarted empty), or the sale's bucket count
-- changed, the loader unloads every bucket before it reads the database with a new epoch
-- (see docs/invariants.md, "Bucketed sales").
--
-- KEYS[1] meta   KEYS[2] lock (bucket 0's lock, or the lock's stamp in another bucket)
-- ARGV[1] owner
--
-- Returns 1 when the bucket is unloaded (now or before), 0 when not the lock's owner.
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[1])
return 1
