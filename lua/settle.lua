-- settle.lua: drop a ledger entry once the database holds its outcome.
--
-- KEYS[1] ledger
-- ARGV[1] user id
-- ARGV[2] the id the entry must carry: the request id (reservation), the cancel id (cancel)
--         or the check token (orphan check mark)
--
-- Returns 1 = entry dropped, 0 = no entry for that id (already settled or compensated).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local _, id = string.match(v, '^(%a)|([^|]+)|')
if id ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
