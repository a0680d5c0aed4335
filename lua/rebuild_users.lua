-- rebuild_users.lua: rebuild `users` of a sale Redis does not hold, before it is loaded.
--
-- Only the lock owner, and only while the sale has no meta (no purchase can run yet): the
-- first chunk empties `users` and the ledger (what is left of a lost sale: its reservations
-- died with it, see preheat.lua), every chunk adds the holders of live orders, each with
-- its order's request id. The sentinels and the expiry are preheat.lua's, which runs next.
--
-- KEYS[1] users   KEYS[2] ledger   KEYS[3] meta
-- KEYS[4] lock (a hash of its holder's holds, see lock_acquire.lua)
-- ARGV[1] owner   ARGV[2] "first" for the first chunk, "more" after
-- ARGV[3..] pairs: user id, the request id of the user's live order
--
-- Returns 1 = done, 0 = refused (not the owner, or the sale is loaded).
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if ARGV[2] == 'first' then redis.call('DEL', KEYS[1], KEYS[2]) end
for i = 3, #ARGV - 1, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
