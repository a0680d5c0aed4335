-- cancel_finish.lua: give a cancelled order's units and the user's quota back to Redis.
--
-- Runs after the database committed the cancellation, for the cancel id the order row
-- recorded: it applies only while that attempt's "c|<cancelId>|..." entry is there, and
-- removes it, so it applies exactly once and never for an attempt that did not commit.
--
-- KEYS[1] meta (its `stock` field)   KEYS[2] users   KEYS[3] ledger
-- ARGV[1] user id   ARGV[2] cancel id
--
-- Returns {applied, qty}: 1 = stock and quota given back, 0 = no such entry (already done,
-- or never this attempt's).
local v = redis.call('HGET', KEYS[3], ARGV[1])
if not v then return {0, 0} end
local kind, id, qty = string.match(v, '^(%a)|([^|]+)|(%d+)|')
if kind ~= 'c' or id ~= ARGV[2] then return {0, 0} end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'stock', qty)
  redis.call('HINCRBY', KEYS[1], 'seq', 1)
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return {1, tonumber(qty)}
