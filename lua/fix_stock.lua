-- fix_stock.lua: correct Redis stock from the database, only when nothing moved meanwhile.
--
-- Applied only by the lock owner, only while the ledger is empty (no reservation or cancel
-- between Redis and the DB) and only if the sale's sequence is still the one reconcile read
-- with the stock. The sequence, bumped by every script that moves stock, is compared rather
-- than the stock value: a purchase and a cancel that cancel out leave the value as it was,
-- but not the sequence.
--
-- KEYS[1] stock   KEYS[2] ledger   KEYS[3] lock (a hash of its holder's holds, see
-- lock_acquire.lua)   KEYS[4] meta
-- ARGV[1] owner   ARGV[2] observed seq   ARGV[3] target stock (DB remaining)
--
-- Returns 1 = corrected, 0 = skipped (not owner, ledger busy, or stock moved meanwhile).
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return 0 end
if redis.call('HLEN', KEYS[2]) > 0 then return 0 end
if tonumber(redis.call('HGET', KEYS[4], 'seq') or '0') ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL')
redis.call('HINCRBY', KEYS[4], 'seq', 1)
return 1
