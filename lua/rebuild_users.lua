-- rebuild_users.lua: rebuild the user set of a sale Redis does not hold, before it is loaded.
--
-- Only the lock owner, and only while the sale has no meta (no purchase can run yet): the
-- first chunk empties the user set and the ledger (what is left of a lost sale: its
-- reservations died with it, see preheat.lua), every chunk adds holders of live orders.
--
-- KEYS[1] users   KEYS[2] ledger   KEYS[3] meta
-- KEYS[4] lock (a hash of its holder's holds, see lock_acquire.lua)
-- ARGV[1] owner   ARGV[2] "first" for the first chunk, "more" after   ARGV[3..] user ids
--
-- Returns 1 = done, 0 = refused (not the owner, or the sale is loaded).
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if ARGV[2] == 'first' then redis.call('DEL', KEYS[1], KEYS[2]) end
for i = 3, #ARGV do redis.call('SADD', KEYS[1], ARGV[i]) end
return 1
