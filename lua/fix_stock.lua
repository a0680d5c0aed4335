-- fix_stock.lua: set Redis stock to the database's, only for the lock owner, only while the
-- sale is loaded, the ledger quiet (no field but the sentinel) and the stock sequence still
-- the one read with the stock (docs/invariants.md, "Reconcile", step 5). The sequence, not
-- the value: a purchase and a cancel that cancel out leave the value, not the sequence.
--
-- KEYS[1] meta   KEYS[2] ledger   KEYS[3] lock (its holder's holds, see lock_acquire.lua)
-- ARGV[1] owner   ARGV[2] observed seq   ARGV[3] target stock (the database's remaining)
--
-- Returns:
local SKIPPED = 0 -- not the owner, not loaded, ledger busy, or the stock moved meanwhile
local FIXED = 1
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return SKIPPED end
if redis.call('EXISTS', KEYS[1]) == 0 then return SKIPPED end
if redis.call('HLEN', KEYS[2]) > redis.call('HEXISTS', KEYS[2], '') then return SKIPPED end
if tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') ~= tonumber(ARGV[2]) then return SKIPPED end
redis.call('HSET', KEYS[1], 'stock', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'seq', 1)
return FIXED
