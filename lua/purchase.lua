-- purchase.lua: decide one purchase atomically (the seckill-entry hot path).
--
-- Every check runs before any write, so a refused request changes nothing.
-- Order of checks: loaded -> caller's deadline -> window -> per-order limit -> stock -> the
-- user's entry in flight -> one order per user. Refusals before the stock check cost three
-- commands (HMGET, TIME, GET): they are the bulk of a sale's traffic.
--
-- KEYS[1] stock   string, units left in Redis          ({<activityId>} hash tag on every key)
-- KEYS[2] meta    hash: startMs, endMs, limit, expireAtMs, total, version, seq, epoch
-- KEYS[3] users   set of user ids holding a reservation or an order
-- KEYS[4] ledger  hash: user id -> in-flight entry (see docs/invariants.md, "The state")
-- ARGV[1] user id (from the verified JWT)
-- ARGV[2] quantity (validated by the caller as an integer >= 1)
-- ARGV[3] request id (uuid, becomes the order's request id)
-- ARGV[4] deadline, ms on this server's clock: the caller stops waiting for the answer then
--
-- Returns {code, stock, nowMs, epoch} (epoch: the load epoch of the sale, see preheat.lua):
--   0 accepted: stock decremented, user added, reservation recorded, seq bumped;
--     stock = units left. Also the answer when this request's reservation is already there
--     (the same script delivered twice, as a cluster client may after a dropped connection),
--     unless that first run took the last units: the second then answers sold_out, and the
--     reservation is given back after reconcile's grace period like any unsent one.
--   1 not_found: the activity is not loaded in Redis
--   2 not_started   3 ended   (window checked against Redis server TIME)
--   4 quantity_exceeds_limit
--   5 sold_out: stock < quantity; stock = units left
--   6 already_purchased: the user holds a reservation or an order, or has an entry in flight
--   7 expired: the script ran after the caller's deadline (the caller has answered 503, so
--     acting now would leave a reservation nobody will ever send)
local meta = redis.call('HMGET', KEYS[2], 'startMs', 'endMs', 'limit', 'expireAtMs', 'epoch')
if not meta[1] then return {1, -1, 0, 0} end
local epoch = tonumber(meta[5] or '0')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now > tonumber(ARGV[4]) then return {7, -1, now, epoch} end
if now < tonumber(meta[1]) then return {2, -1, now, epoch} end
if now >= tonumber(meta[2]) then return {3, -1, now, epoch} end
local qty = tonumber(ARGV[2])
if qty > tonumber(meta[3]) then return {4, -1, now, epoch} end
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
if stock < qty then return {5, stock, now, epoch} end
-- An entry of the user in flight is never overwritten; this request's own means it already ran.
local entry = redis.call('HGET', KEYS[4], ARGV[1])
if entry then
  if string.sub(entry, 1, 2 + #ARGV[3]) == 'r|' .. ARGV[3] then
    return {0, tonumber(redis.call('GET', KEYS[1]) or '0'), now, epoch}
  end
  return {6, -1, now, epoch}
end
-- SADD of a member changes nothing: its answer is the one-order-per-user check.
if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then return {6, stock, now, epoch} end
stock = redis.call('DECRBY', KEYS[1], qty)
redis.call('HSET', KEYS[4], ARGV[1], 'r|' .. ARGV[3] .. '|' .. qty .. '|' .. now)
redis.call('HINCRBY', KEYS[2], 'seq', 1)
-- The set and the ledger are created by the first purchase: give them the sale's expiry.
if meta[4] and redis.call('PTTL', KEYS[3]) == -1 then redis.call('PEXPIREAT', KEYS[3], meta[4]) end
if meta[4] and redis.call('PTTL', KEYS[4]) == -1 then redis.call('PEXPIREAT', KEYS[4], meta[4]) end
return {0, stock, now, epoch}
