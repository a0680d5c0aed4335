-- settle.lua: drop a ledger entry once the database holds its outcome.
--
-- KEYS[1] ledger
-- ARGV[1] user id
-- ARGV[2] request id (reservation) or order id (cancel) the entry must carry
--
-- Returns 1 = entry dropped, 0 = no entry for that id (already settled or compensated).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local _, rid = string.match(v, '^(%a)|([^|]+)|')
if rid ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
