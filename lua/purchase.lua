-- purchase.lua: decide one purchase atomically (the seckill-entry hot path).
--
-- Every check runs before any write, so a refused request changes nothing.
-- Order of checks: loaded -> caller's deadline -> window -> per-order limit -> stock -> the
-- user's field in `users` (one order per user, and this very request run twice). Commands
-- run: any refusal at most three (HMGET, TIME, HGET), a success six (HMGET, TIME, HGET, and one
-- HSET each of users, ledger and meta). Preheat created `users` and `ledger` with the sale's
-- expiry, each holding a sentinel field so it never empties and loses it: no PTTL here.
--
-- KEYS[1] meta    hash: startMs, endMs, limit, expireAtMs, total, version, stock, seq, epoch
-- KEYS[2] users   hash: user id -> the request id of the purchase that added the user
-- KEYS[3] ledger  hash: user id -> in-flight entry (see docs/invariants.md, "The state")
--                 ({<activityId>} hash tag on every key)
-- ARGV[1] user id (from the verified JWT; never empty, so never the sentinel field "")
-- ARGV[2] quantity (validated by the caller as an integer >= 1)
-- ARGV[3] request id (uuid, becomes the order's request id)
-- ARGV[4] deadline, ms on this server's clock: the caller stops waiting for the answer then
--
-- Returns {code, stock, nowMs, epoch} (epoch: the load epoch of the sale, see preheat.lua):
--   0 accepted: stock decremented, user added, reservation recorded, seq bumped;
--     stock = units left. Also the answer when the user's field already names this request
--     (the same script delivered twice, as a cluster client may after a dropped connection),
--     unless that first run took the last units: the second then answers sold_out, and the
--     reservation is given back after reconcile's grace period like any unsent one.
--   1 not_found: the activity is not loaded in Redis
--   2 not_started   3 ended   (window checked against Redis server TIME)
--   4 quantity_exceeds_limit
--   5 sold_out: stock < quantity; stock = units left
--   6 already_purchased: the user holds a reservation, an order or a cancel in flight (every
--     ledger entry of a user comes with the user's field, see docs/invariants.md)
--   7 expired: the script ran after the caller's deadline (the caller has answered 503, so
--     acting now would leave a reservation nobody will ever send)
local meta = redis.call('HMGET', KEYS[1], 'startMs', 'endMs', 'limit', 'epoch', 'stock', 'seq')
if not meta[1] then return {1, -1, 0, 0} end
local epoch = tonumber(meta[4] or '0')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now > tonumber(ARGV[4]) then return {7, -1, now, epoch} end
if now < tonumber(meta[1]) then return {2, -1, now, epoch} end
if now >= tonumber(meta[2]) then return {3, -1, now, epoch} end
local qty = tonumber(ARGV[2])
if qty > tonumber(meta[3]) then return {4, -1, now, epoch} end
local stock = tonumber(meta[5] or '0')
if stock < qty then return {5, stock, now, epoch} end
local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder == ARGV[3] then return {0, stock, now, epoch} end
if holder then return {6, -1, now, epoch} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], 'r|' .. ARGV[3] .. '|' .. qty .. '|' .. now)
-- One write of both: the script is atomic, so nothing moved them since the HMGET.
redis.call('HSET', KEYS[1], 'stock', stock - qty, 'seq', tonumber(meta[6] or '0') + 1)
return {0, stock - qty, now, epoch}
