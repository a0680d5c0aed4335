-- rebuild_users.lua: one chunk of `users` of a sale Redis does not hold, before it is loaded
-- (docs/invariants.md, "Load", step 3): only the lock owner, only while the meta is absent;
-- the first chunk empties `users`, the ledger and a draw sale's pool, tickets and winners (a
-- draw's state without its meta, whose cursor and flag are gone, would run the draw again;
-- the load rebuilds the pool from the database's entries and recorded outcome after
-- preheat.lua), every chunk adds holders of live orders with their orders' request ids.
--
-- KEYS[1] users   KEYS[2] ledger   KEYS[3] meta   KEYS[4] lock (its holder's holds)
-- KEYS[5] pool   KEYS[6] tickets   KEYS[7] winners
-- ARGV[1] owner   ARGV[2] "first" for the first chunk, "more" after
-- ARGV[3..] pairs: user id, the request id of the user's live order
--
-- Returns:
local REFUSED = 0 -- not the owner, or the sale is loaded
local REBUILT = 1
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 0 then return REFUSED end
if redis.call('EXISTS', KEYS[3]) == 1 then return REFUSED end
if ARGV[2] == 'first' then redis.call('DEL', KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7]) end
for i = 3, #ARGV - 1, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return REBUILT
