-- purchase.lua: decide one purchase atomically (the seckill-entry hot path).
--
-- Every check runs before any write, so a refused request changes nothing (but for the
-- credits below, which are not the purchase's: they move units another bucket already gave
-- up, and but for the per-user rate's counter). Order of checks: loaded -> the caller's bucket
-- count -> the per-user rate -> caller's deadline -> window -> per-order limit -> (a draw
-- sale's pool) -> stock -> the user's field in `users` (one order per user, and this very
-- request run twice). Commands run in a first-come sale without a rate: any refusal at most
-- three (HMGET, TIME, HGET), a success six (HMGET, TIME, HGET, and one HSET each of users,
-- ledger and meta). A rate adds an INCR (and a PEXPIRE on the first attempt of a second); a
-- rate refusal is HMGET, INCR, HGET and PTTL. In a draw window an entry is six (HMGET, TIME,
-- HGET pool, HEXISTS users, HINCRBY, HSET pool); after the draw a purchase reads the pool
-- once more. Preheat created `users`, `ledger` (and a draw sale's pool) with the sale's
-- expiry, each holding a sentinel field so it never empties and loses it: no PTTL here.
--
-- In a bucketed sale these are the keys of the user's home bucket (see keys.rs, `Bucket`).
-- KEYS[1] meta    hash: startMs, endMs, limit, expireAtMs, total, version, stock, seq, epoch,
--                 buckets
-- KEYS[2] users   hash: user id -> the request id of the purchase that added the user
-- KEYS[3] ledger  hash: user id -> in-flight entry (see docs/invariants.md, "The state")
-- KEYS[4] pool    hash: a draw sale's pool, user id -> `requestId|qty|rank|state` (read only
--                 when the meta has a `drawEndMs`)
-- KEYS[5] rate    string: this user's attempts in the current second (only when the meta has
--                 a `rate`)
--                 (one hash tag on every key)
-- ARGV[1] user id (from the verified JWT; never empty, so never the sentinel field "")
-- ARGV[2] quantity (validated by the caller as an integer >= 1)
-- ARGV[3] request id (uuid, becomes the order's request id)
-- ARGV[4] deadline, ms on this server's clock: the caller stops waiting for the answer then
-- ARGV[5] the sale's bucket count the caller chose this bucket with (absent: 1)
-- ARGV[6..] credits, three arguments each: transfer id, units, load epoch. Units that
--         lua/borrow.lua took from other buckets of the sale for this purchase; each is added
--         to this bucket's stock once (`in:<id>` in the meta), and only under the epoch it
--         was taken in. They are added before the checks, whatever the purchase answers.
--
-- Returns {code, stock, nowMs, epoch, credited} (epoch: the load epoch of the sale, see
-- preheat.lua; credited: 1 when every credit is in this bucket's stock, now or before):
--   0 accepted: stock decremented, user added, reservation recorded, seq bumped;
--     stock = units left. Also the answer when the user's field already names this request
--     (the same script delivered twice, as a cluster client may after a dropped connection),
--     unless that first run took the last units of a sale with one bucket: the second then
--     answers sold_out, and the reservation is given back after reconcile's grace period
--     like any unsent one.
--   1 not_found: the activity (this bucket) is not loaded in Redis
--   2 not_started   3 ended   (window checked against Redis server TIME)
--   4 quantity_exceeds_limit
--   5 sold_out: stock < quantity; stock = units left (a sale with one bucket)
--   6 already_purchased: the user holds a reservation, an order or a cancel in flight (every
--     ledger entry of a user comes with the user's field, see docs/invariants.md)
--   7 expired: the script ran after the caller's deadline (the caller has answered 503, so
--     acting now would leave a reservation nobody will ever send)
--   8 layout: the sale has another bucket count than the caller's; stock = the sale's count
--   9 short: a bucketed sale's bucket holds fewer units than asked and the user is free to
--     buy; stock = units here. The caller borrows from the other buckets and asks again.
--   10 queued: a draw sale's window is open and the user is now in its pool (or this very
--     request already was); stock = the entry's arrival rank. No stock is taken.
--   11 draw_due: a draw sale's window has closed and its draw has not run: the caller runs
--     lua/draw.lua and asks again. Nothing changed.
--   12 rate_limited: the user made more than the sale's `rate` attempts this second; stock =
--     ms until the second is over. Nothing changed but the user's counter.
--
-- A draw sale (meta `drawEndMs` > 0): from the start until `drawEndMs` a purchase that passes
-- the window and limit checks joins the pool instead of taking stock (one entry per user).
-- After the window and its draw, the sale sells first come, first served, except to the pool's
-- losers (state `q` once `drawn` is set), whose entry stays final. A winner (`w`) is a buyer like
-- any other: after a cancel they may buy again.
-- Per-user rate (meta `rate` > 0): counted before the time checks, so attempts before the
-- start count too; a purchase carrying credits (the second step of a borrow) is not counted
-- again.
local meta = redis.call('HMGET', KEYS[1], 'startMs', 'endMs', 'limit', 'epoch', 'stock', 'seq',
  'buckets', 'drawEndMs', 'drawn', 'rate')
if not meta[1] then return {1, -1, 0, 0, 0} end
local epoch = tonumber(meta[4] or '0')
local buckets = tonumber(meta[7] or '1')
if buckets ~= tonumber(ARGV[5] or '1') then return {8, buckets, 0, epoch, 0} end
local rate = tonumber(meta[10] or '0')
local counted = false
if rate > 0 and #ARGV <= 5 then
  local n = redis.call('INCR', KEYS[5])
  if n == 1 then redis.call('PEXPIRE', KEYS[5], 1000) end
  counted = true
  if n > rate then
    -- This very request already took effect (the script delivered twice): it is answered as
    -- before, and not counted again.
    local mine = ARGV[3] .. '|'
    if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[3] or (tonumber(meta[8] or '0') > 0
        and string.sub(redis.call('HGET', KEYS[4], ARGV[1]) or '', 1, #mine) == mine) then
      redis.call('DECR', KEYS[5])
      counted = false
    else
      local left = redis.call('PTTL', KEYS[5])
      if left < 0 then
        redis.call('PEXPIRE', KEYS[5], 1000)
        left = 1000
      end
      return {12, left, 0, epoch, 0}
    end
  end
end
-- An answer that asks the caller to come again (expired, draw_due) is not an attempt.
local function uncount()
  if counted then redis.call('DECR', KEYS[5]) end
end
local credited = 1
if #ARGV > 5 then
  local stock, moved = tonumber(meta[5] or '0'), false
  for i = 6, #ARGV - 2, 3 do
    if tonumber(ARGV[i + 2]) ~= epoch then
      credited = 0
    elseif redis.call('HSETNX', KEYS[1], 'in:' .. ARGV[i], ARGV[i + 1]) == 1 then
      stock, moved = stock + tonumber(ARGV[i + 1]), true
    end
  end
  if moved then
    meta[5], meta[6] = stock, tonumber(meta[6] or '0') + 1
    redis.call('HSET', KEYS[1], 'stock', meta[5], 'seq', meta[6])
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Past the deadline nothing happens, the count included.
if now > tonumber(ARGV[4]) then uncount() end
if now > tonumber(ARGV[4]) then return {7, -1, now, epoch, credited} end
if now < tonumber(meta[1]) then return {2, -1, now, epoch, credited} end
if now >= tonumber(meta[2]) then return {3, -1, now, epoch, credited} end
local qty = tonumber(ARGV[2])
if qty > tonumber(meta[3]) then return {4, -1, now, epoch, credited} end
local draw_end = tonumber(meta[8] or '0')
if draw_end > 0 then
  if now < draw_end then
    local entry = redis.call('HGET', KEYS[4], ARGV[1])
    if entry then
      if string.sub(entry, 1, #ARGV[3] + 1) == ARGV[3] .. '|' then
        return {10, tonumber(string.match(entry, '^[^|]*|[^|]*|([^|]*)')), now, epoch, credited}
      end
      return {6, -1, now, epoch, credited}
    end
    if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {6, -1, now, epoch, credited} end
    local rank = redis.call('HINCRBY', KEYS[1], 'poolSize', 1)
    redis.call('HSET', KEYS[4], ARGV[1], ARGV[3] .. '|' .. qty .. '|' .. rank .. '|q')
    return {10, rank, now, epoch, credited}
  end
  if meta[9] ~= '1' then
    uncount()
    return {11, -1, now, epoch, credited}
  end
  local entry = redis.call('HGET', KEYS[4], ARGV[1])
  if entry and string.sub(entry, -2) == '|q' then
    return {6, -1, now, epoch, credited}
  end
end
local stock = tonumber(meta[5] or '0')
if stock < qty and buckets == 1 then return {5, stock, now, epoch, credited} end
local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder == ARGV[3] then return {0, stock, now, epoch, credited} end
if holder then return {6, -1, now, epoch, credited} end
if stock < qty then return {9, stock, now, epoch, credited} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], 'r|' .. ARGV[3] .. '|' .. qty .. '|' .. now)
-- One write of both: the script is atomic, so nothing moved them since the HMGET.
redis.call('HSET', KEYS[1], 'stock', stock - qty, 'seq', tonumber(meta[6] or '0') + 1)
return {0, stock - qty, now, epoch, credited}
