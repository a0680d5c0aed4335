-- settle.lua: drop a ledger entry once the database holds its outcome.
--
-- KEYS[1] ledger
-- ARGV[1] user id (or a transfer's field)
-- ARGV[2] the id the entry must carry: the request id (reservation), the cancel id (cancel),
--         the check token (orphan check mark) or the transfer id
--
-- Returns:
local NOT_THERE = 0 -- no entry for that id (already settled or given back)
local DROPPED = 1
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return NOT_THERE end
local _, id = entry_fields(v)
if id ~= ARGV[2] then return NOT_THERE end
redis.call('HDEL', KEYS[1], ARGV[1])
return DROPPED
