-- pool_leave.lua: take back a draw entry whose purchase was answered 503 (docs/invariants.md,
-- "Draw admission", step 1). Before the draw it leaves the pool; after it a loser's leaves
-- too, a winner's stays (its reservation is given back like any other).
--
-- KEYS[1] pool   KEYS[2] meta
-- ARGV[1] user id (empty: no entry, only the cursor)   ARGV[2] request id
-- ARGV[3] (optional) the clean-up's cursor: the row id up to which the purchases answered 503
--         are handled; the meta's `leftAfter` moves up to it (never down, and only while the
--         sale is loaded: a meta is never made here)
--
-- Returns:
local STAYED = 0 -- none for this request
local LEFT = 1
local WINNER = 2 -- drawn a winner: stays (its reservation is the ledger's to give back)
if ARGV[3] and redis.call('EXISTS', KEYS[2]) == 1 then
  local at = tonumber(redis.call('HGET', KEYS[2], 'leftAfter') or '0')
  if tonumber(ARGV[3]) > at then redis.call('HSET', KEYS[2], 'leftAfter', ARGV[3]) end
end
if ARGV[1] == '' then return STAYED end
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry or string.sub(entry, 1, #ARGV[2] + 1) ~= ARGV[2] .. '|' then return STAYED end
if string.sub(entry, -2) == '|w' then return WINNER end
redis.call('HDEL', KEYS[1], ARGV[1])
return LEFT
