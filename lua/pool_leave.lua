-- pool_leave.lua: take back a draw entry whose purchase was answered 503 (docs/invariants.md,
-- "Draw admission", step 1). Before the draw it leaves the pool; after it a loser's leaves
-- too, a winner's stays (its reservation is given back like any other). The entry becomes a
-- tombstone (state `x`, no units), written also when the entry is not (yet) there: the
-- consumer's restore of the same request, which may come after, finds the user's field taken
-- and adds nothing, while a new purchase of the user may enter again.
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
local tombstone = pool_entry(ARGV[2], 0, 0, 'x')
if not entry then
  -- Only into a pool that is there: a pool is never made here.
  if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], tombstone) end
  return STAYED
end
local request_id, qty, _, state = pool_fields(entry)
if request_id ~= ARGV[2] then return STAYED end
if state == 'w' then return WINNER end
if state == 'x' then return STAYED end
redis.call('HSET', KEYS[1], ARGV[1], tombstone)
-- Before the draw's first step no cursor passed it; after, it keeps its count (high is safe).
-- Only in a loaded meta: a meta is never made here.
local at = redis.call('HMGET', KEYS[2], 'stock', 'drawAt')
if state == 'q' and at[1] and not at[2] then uncount_entry(KEYS[2], qty) end
return LEFT
