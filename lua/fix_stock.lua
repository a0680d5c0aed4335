-- fix_stock.lua: correct Redis stock from the database, only when nothing moved meanwhile.
--
-- Applied only by the lock owner, only while the sale is loaded and the ledger is quiet (no
-- reservation or cancel between Redis and the DB: no field but the sentinel "", which
-- preheat.lua puts there so the hash keeps its expiry) and only if the sale's sequence is
-- still the one reconcile read with the stock. The sequence, bumped by every script that
-- moves stock, is compared rather than the stock value: a purchase and a cancel that cancel
-- out leave the value as it was, but not the sequence.
--
-- KEYS[1] meta (its `stock` and `seq` fields)   KEYS[2] ledger
-- KEYS[3] lock (a hash of its holder's holds, see lock_acquire.lua)
-- ARGV[1] owner   ARGV[2] observed seq   ARGV[3] target stock (DB remaining)
--
-- Returns 1 = corrected, 0 = skipped (not owner, not loaded, ledger busy, or stock moved
-- meanwhile).
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HLEN', KEYS[2]) > redis.call('HEXISTS', KEYS[2], '') then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') ~= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'stock', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'seq', 1)
return 1
