-- purchase.lua: decide one purchase atomically (the seckill-entry hot path).
-- docs/invariants.md, "Entry: a purchase", "Bucketed sales" and "Draw admission", tells the
-- protocol; this script is its step 1. The sale's terms (window, per-order limit, draw end,
-- per-user rate) do not change while it runs: the caller carries them, and the script reads
-- them from the meta only when her copy is not the meta's own. First the meta's one read and
-- the commonest answer of a hot sale: a sale of one bucket, first come, first served, whose
-- stock is 0 is sold out, for any caller that carries its terms, whatever else would refuse
-- her or count her attempt, before anything else is made or read. Then every check runs
-- before any write (but for the credits, which move units another bucket already gave up,
-- and the per-user rate's counter), in this order: loaded, the caller's bucket count, the
-- rate, the caller's deadline, the window, the per-order limit, a draw sale's pool, stock,
-- the user's field in `users`: the main at the bottom, each concern a function above it.
-- With the terms carried, a sold-out refusal runs one command (HMGET), any other first-come
-- refusal at most three (HMGET, TIME, HGET), a success six; without them, one HMGET more.
--
-- KEYS[1] meta    KEYS[2] users    KEYS[3] ledger    KEYS[4] pool (read when the terms have a
-- draw end)    KEYS[5] rate: this user's attempts of the current second (when the terms have
-- a rate)    KEYS[6] tickets (a draw sale's); one hash tag on every key (the user's home
-- bucket in a bucketed sale)
-- ARGV[1] user id (from the verified JWT; never empty, so never the sentinel field "")
-- ARGV[2] quantity (an integer >= 1)   ARGV[3] request id (a uuid)
-- ARGV[4] deadline, ms on this server's clock: the caller stops waiting for the answer then
-- ARGV[5] the sale's bucket count the caller chose this bucket with
-- ARGV[6] the caller's copy of the sale's terms (the meta's `terms`, prelude's sale_terms; ''
--         for none) and ARGV[7..12] its parts: version, startMs, endMs, limit, drawEndMs,
--         rate. They stand in for those fields only when ARGV[6] is the meta's `terms` and
--         ARGV[7] its `version`; any other copy is not used (the fields are read), and the
--         answer carries the meta's `terms` to keep
-- ARGV[13..] credits, three arguments each: transfer id, units, load epoch (units lua/borrow.lua
--         took from other buckets for this purchase; each added to this bucket's stock once,
--         `in:<id>` in the meta, and only under the epoch it was taken in); a purchase's
--         second call with no credit (its first found the bucket short, and its sale-wide check
--         found units back here) passes one empty argument, so that the rate counts it once
--
-- Returns {code, value, nowMs, epoch, credited} (credited: 1 when every credit is in this
-- bucket's stock, now or before) and, when the caller's copy of the terms was not the meta's,
-- a sixth element: the meta's `terms` (nil when it has none); or the bare code SOLD_OUT from
-- the meta's read alone (value 0, no credit, the copy the meta's). The codes, and `value`:
local ACCEPTED = 0 -- stock taken, user added, reservation recorded, seq bumped; value = units
--   left. Also the answer when the user's field already names this request (the script
--   delivered twice), unless that first run took a one-bucket sale's last units: then sold_out.
local NOT_FOUND = 1 -- this bucket is not loaded
local NOT_STARTED = 2 -- the window, against this server's TIME
local ENDED = 3
local QUANTITY_EXCEEDS_LIMIT = 4
local SOLD_OUT = 5 -- stock < quantity in a sale with one bucket; value = units left
local ALREADY_PURCHASED = 6 -- the user holds a reservation, an order or a cancel in flight
local EXPIRED = 7 -- the script ran after the caller's deadline and changed nothing
local LAYOUT = 8 -- the sale has another bucket count than the caller's; value = that count
local SHORT = 9 -- a bucketed sale's bucket holds fewer units than asked and the user is free
--   to buy; value = units here: the caller borrows from the other buckets and asks again
local QUEUED = 10 -- a draw sale's window is open and the user is in its pool; value = rank
local DRAW_DUE = 11 -- a draw sale's window has closed and its draw has not run; nothing changed
local RATE_LIMITED = 12 -- past the sale's per-user rate this second; value = ms until the
--   second is over; nothing changed but the user's counter
local POOL_FULL = 13 -- a draw sale's pool holds `maxEntrants` entrants and the user is not one
--   of them; nothing changed

-- The meta's terms and version and the fields that change during a sale, read once; then
-- sold out, before any function is made (the prelude's and this script's are made below):
-- the caller's terms are the meta's and say no draw (drawEndMs 0), the sale has one bucket (no
-- `buckets`, or 1), its stock is 0, and the caller has one bucket too and brings no credit.
-- Nothing changes, and the answer is the bare code: no table to build. (A value written in
-- another form, a `1.0`, only misses this and takes the whole way.)
local meta = redis.call('HMGET', KEYS[1], 'terms', 'version', 'stock', 'buckets', 'epoch', 'seq')
local carried = meta[1] == ARGV[6] and meta[2] == ARGV[7]
if meta[3] == '0' and carried and ARGV[11] == '0' and (meta[4] or '1') == '1' and #ARGV <= 12
    and ARGV[5] == '1' then
  return SOLD_OUT
end

--[[ prelude ]]

-- The terms: the caller's copy when it is the meta's, else the meta's own fields (all absent:
-- the bucket is not loaded).
local start_ms, end_ms, limit, draw_end, rate = ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
if not carried then
  local t = redis.call('HMGET', KEYS[1], 'startMs', 'endMs', 'limit', 'drawEndMs', 'rate')
  start_ms, end_ms, limit, draw_end, rate = t[1], t[2], t[3], t[4], t[5]
end
local epoch = tonumber(meta[5] or '0')

-- The answer as a table; a caller whose terms were not the meta's gets the meta's.
local function answer(code, value, now, credited)
  if carried then return {code, value, now, epoch, credited} end
  return {code, value, now, epoch, credited, meta[1]}
end

-- The per-user rate, on a sale with a `rate` (a call with credits, or the one empty argument,
-- is a purchase's second one, counted on its first): counts this attempt (INCR, and PEXPIRE
-- on the first of a second). Answers the ms until the second is over when past the rate
-- (nothing changed but the counter), then whether the attempt is counted.
local function count_attempt()
  local per_second = tonumber(rate or '0')
  if per_second <= 0 or #ARGV > 12 then return nil, false end
  local n = redis.call('INCR', KEYS[5])
  if n == 1 then redis.call('PEXPIRE', KEYS[5], 1000) end
  if n <= per_second then return nil, true end
  -- This very request already took effect (the script delivered twice): it is answered as
  -- before, and not counted again.
  if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[3] or (tonumber(draw_end or '0') > 0
      and pool_fields(redis.call('HGET', KEYS[4], ARGV[1]) or '') == ARGV[3]) then
    redis.call('DECR', KEYS[5])
    return nil, false
  end
  local left = redis.call('PTTL', KEYS[5])
  if left < 0 then
    redis.call('PEXPIRE', KEYS[5], 1000)
    left = 1000
  end
  return left, true
end

-- An answer that asks the caller to come again (expired, draw_due) is not an attempt.
local function uncount(counted)
  if counted then redis.call('DECR', KEYS[5]) end
end

-- The credits (ARGV[13..]), before the checks and whatever they answer: each transfer's units
-- go into this bucket's stock once (`in:<id>`), only under the epoch they were taken in, and
-- the stock with its sequence is written once (into `meta` as well). Answers 1 when every
-- credit is in the stock, now or before, else 0.
local function take_credits()
  local credited, stock, moved = 1, tonumber(meta[3] or '0'), false
  for i = 13, #ARGV - 2, 3 do
    if tonumber(ARGV[i + 2]) ~= epoch then
      credited = 0
    elseif redis.call('HSETNX', KEYS[1], 'in:' .. ARGV[i], ARGV[i + 1]) == 1 then
      stock, moved = stock + tonumber(ARGV[i + 1]), true
    end
  end
  if moved then
    meta[3], meta[6] = stock, put_stock(KEYS[1], stock, tonumber(meta[6] or '0'))
  end
  return credited
end

-- The window, against this server's clock, and the per-order limit: the refusal, if any.
local function outside_window_or_limit(now, qty)
  if now < tonumber(start_ms) then return NOT_STARTED end
  if now >= tonumber(end_ms) then return ENDED end
  if qty > tonumber(limit) then return QUANTITY_EXCEEDS_LIMIT end
end

-- A draw sale, after the limit check: its pool while the window is open, draw_due until the
-- draw is done, then already_purchased for a user the draw did not pick (the meta's `drawn`
-- and `drawAt` read here, on a draw sale only). Answers the code and value when the purchase
-- ends here, nothing when it goes on first come, first served.
local function draw_admission(draw_end_ms, now, qty, counted)
  -- A draw sale's open window: the user's pool entry (this request's: queued again, the script
  -- delivered twice), or a new one with the next arrival rank and the user's ticket.
  local function enter_pool()
    local entry = redis.call('HGET', KEYS[4], ARGV[1])
    local request_id, _, rank, state = pool_fields(entry or '')
    -- A tombstone (an entry taken back after a 503) is no entry: the user may enter again.
    if entry and state ~= 'x' then
      if request_id == ARGV[3] then return QUEUED, tonumber(rank) end
      return ALREADY_PURCHASED, -1
    end
    if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return ALREADY_PURCHASED, -1 end
    local pads = redis.call('HMGET', KEYS[1], 'drawKeyI', 'drawKeyO', 'maxEntrants', 'fitMin')
    if not pads[1] or not pads[2] then return redis.error_reply('ERR draw secret not loaded') end
    -- The sentinel is one member of `tickets`; an entrant taken back after a 503 keeps a ticket
    -- and may always come back.
    if redis.call('ZCARD', KEYS[6]) - 1 >= tonumber(pads[3] or '1000000')
        and not redis.call('ZSCORE', KEYS[6], ARGV[1]) then
      return POOL_FULL, -1
    end
    -- An entry taken back after a 503 and made again gets the same ticket.
    local ticket = ticket_of(pads[1], pads[2], ARGV[1])
    local rank = redis.call('HINCRBY', KEYS[1], 'poolSize', 1)
    redis.call('HSET', KEYS[4], ARGV[1], pool_entry(ARGV[3], qty, rank, 'q'))
    redis.call('ZADD', KEYS[6], ticket, ARGV[1])
    count_entry(KEYS[1], qty, pads[4])
    return QUEUED, rank
  end
  -- Once a draw step ran (`drawAt`), the pool is closed even should this server's clock say
  -- otherwise (a failover to a replica whose clock is behind): an entry now could land below
  -- the cursor and never be looked at.
  local drawn, draw_at = unpack(redis.call('HMGET', KEYS[1], 'drawn', 'drawAt'))
  if now < draw_end_ms and not draw_at and drawn ~= '1' then return enter_pool() end
  if drawn ~= '1' then
    uncount(counted)
    return DRAW_DUE, -1
  end
  local _, _, _, state = pool_fields(redis.call('HGET', KEYS[4], ARGV[1]) or '')
  if state == 'q' or state == 'l' then return ALREADY_PURCHASED, -1 end
end

-- The first-come decision: the stock, then the user's field in `users` (none: free; this very
-- request's: the script delivered twice; any other: an order, a reservation or a cancel in
-- flight). Answers the code and value when the purchase ends here, nothing when the user may
-- reserve.
local function refuse_or_replay(stock, qty, buckets)
  if stock < qty and buckets == 1 then return SOLD_OUT, stock end
  local holder = redis.call('HGET', KEYS[2], ARGV[1])
  if holder == ARGV[3] then return ACCEPTED, stock end
  if holder then return ALREADY_PURCHASED, -1 end
  if stock < qty then return SHORT, stock end
end

-- The reservation: the user's field, the `r` entry and one write of the stock and its
-- sequence (the script is atomic, so nothing moved them since the HMGET).
local function reserve(stock, qty, now)
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[1], reservation(ARGV[3], qty, now))
  put_stock(KEYS[1], stock - qty, tonumber(meta[6] or '0'))
end

if not start_ms then return answer(NOT_FOUND, -1, 0, 0) end
local buckets = tonumber(meta[4] or '1')
if buckets ~= tonumber(ARGV[5]) then return answer(LAYOUT, buckets, 0, 0) end
local wait_ms, counted = count_attempt()
if wait_ms then return answer(RATE_LIMITED, wait_ms, 0, 0) end
local credited = 1
if #ARGV > 12 then credited = take_credits() end
local now = now_ms()
-- Past the deadline nothing happens, the count included.
if now > tonumber(ARGV[4]) then
  uncount(counted)
  return answer(EXPIRED, -1, now, credited)
end
local qty = tonumber(ARGV[2])
local code, value = outside_window_or_limit(now, qty)
if code then return answer(code, -1, now, credited) end
local draw_end_ms = tonumber(draw_end or '0')
if draw_end_ms > 0 then
  code, value = draw_admission(draw_end_ms, now, qty, counted)
  -- A table is an error reply: the draw secret is not loaded.
  if type(code) == 'table' then return code end
  if code then return answer(code, value, now, credited) end
end
local stock = tonumber(meta[3] or '0')
code, value = refuse_or_replay(stock, qty, buckets)
if code then return answer(code, value, now, credited) end
reserve(stock, qty, now)
return answer(ACCEPTED, stock - qty, now, credited)
