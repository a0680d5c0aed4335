-- pool_leave.lua: take back a draw entry whose purchase was answered 503 (its script's
-- answer was lost or late, so the caller was told nothing happened).
--
-- Before the draw the entry leaves the pool, so the draw cannot pick it. After the draw a
-- loser's entry leaves too (it holds nothing, and must not keep the user from buying); a
-- winner's stays: its reservation is in the ledger, and the caller's give-back
-- (compensate.lua, after the database's claim) returns it.
--
-- KEYS[1] pool
-- ARGV[1] user id   ARGV[2] request id
--
-- Returns 1 when the entry left the pool, 0 otherwise (none for this request, or a winner).
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry or string.sub(entry, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then return 0 end
if string.sub(entry, -2) == '|w' then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
