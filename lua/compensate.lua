-- compensate.lua: give back a reservation that will never become an order.
--
-- Only the winner of the database's claim calls this (a `failed` row under the request id:
-- see docs/invariants.md), or anyone who read that row. It is also guarded by the ledger
-- entry: it applies only while the entry for this exact request is still there, and removes
-- it in the same step, so a retry, a redelivery or a concurrent repair gives the units back
-- at most once.
--
-- KEYS[1] meta (its `stock` field)   KEYS[2] users   KEYS[3] ledger   (same {<activityId>} tag)
-- ARGV[1] user id
-- ARGV[2] request id
-- ARGV[3] mode: "full"  = stock back and user removed (the purchase never happened)
--               "stock" = stock back only (the user keeps an order they already hold)
--
-- Returns {applied, qty}: applied 1 = units given back (qty of them), 0 = no matching entry.
local v = redis.call('HGET', KEYS[3], ARGV[1])
if not v then return {0, 0} end
local kind, rid, qty = string.match(v, '^(%a)|([^|]+)|(%d+)|')
if kind ~= 'r' or rid ~= ARGV[2] then return {0, 0} end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'stock', qty)
  redis.call('HINCRBY', KEYS[1], 'seq', 1)
end
if ARGV[3] == 'full' then redis.call('HDEL', KEYS[2], ARGV[1]) end
redis.call('HDEL', KEYS[3], ARGV[1])
return {1, tonumber(qty)}
