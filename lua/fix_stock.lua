-- fix_stock.lua: correct Redis stock from the database, only when nothing is in flight.
--
-- Applied only by the lock owner, only while the ledger is empty (no reservation or cancel
-- between Redis and the DB) and only if stock is still what reconcile observed: a purchase
-- that ran meanwhile makes this a no-op instead of being erased.
--
-- KEYS[1] stock   KEYS[2] ledger   KEYS[3] lock
-- ARGV[1] owner   ARGV[2] observed stock   ARGV[3] target stock (DB remaining)
--
-- Returns 1 = corrected, 0 = skipped (not owner, ledger busy, or stock moved meanwhile).
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return 0 end
if redis.call('HLEN', KEYS[2]) > 0 then return 0 end
if tonumber(redis.call('GET', KEYS[1]) or '-1') ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL')
return 1
