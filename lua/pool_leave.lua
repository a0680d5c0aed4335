-- pool_leave.lua: take back a draw entry whose purchase was answered 503 (docs/invariants.md,
-- "Draw admission", step 1). Before the draw it leaves the pool; after it a loser's leaves
-- too, a winner's stays (its reservation is given back like any other).
--
-- KEYS[1] pool
-- ARGV[1] user id   ARGV[2] request id
--
-- Returns:
local STAYED = 0 -- none for this request, or a winner
local LEFT = 1
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry or string.sub(entry, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then return STAYED end
if string.sub(entry, -2) == '|w' then return STAYED end
redis.call('HDEL', KEYS[1], ARGV[1])
return LEFT
