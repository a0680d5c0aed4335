-- restore_user.lua: the last step of a restore of a lost field (see mark_lost.lua and
-- docs/invariants.md, "Lost fields"): removes the restore's mark and, when the database
-- (read after the mark) showed the user's live order, writes that order's request id into
-- the user's field; both only while the mark is still this restore's, and the field only
-- while it still holds what the mark saw (absent, or a request the database holds no live
-- order for).
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger
-- ARGV[1] user id   ARGV[2] token   ARGV[3] what the field held when marked ("": absent)
-- ARGV[4] the request id of the user's live order, read after the mark ("": none)
--
-- Returns:
local NOT_MINE = 0 -- the mark is gone (the user acted, a load emptied the ledger): nothing written
local CLEARED = 1 -- the mark removed, the field left as it was (no live order, or it names it)
local RESTORED = 2 -- the field names the live order's request
local v = redis.call('HGET', KEYS[3], ARGV[1])
if not v then return NOT_MINE end
local kind, token = entry_fields(v)
if kind ~= 'x' or token ~= ARGV[2] then return NOT_MINE end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[4] == '' or redis.call('EXISTS', KEYS[1]) == 0 then return CLEARED end
local held = redis.call('HGET', KEYS[2], ARGV[1]) or ''
if held == ARGV[4] or held ~= ARGV[3] then return CLEARED end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return RESTORED
