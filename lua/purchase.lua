-- purchase.lua: decide one purchase atomically (the seckill-entry hot path).
-- docs/invariants.md, "Entry: a purchase", "Bucketed sales" and "Draw admission", tells the
-- protocol; this script is its step 1. Every check runs before any write (but for the credits,
-- which move units another bucket already gave up, and the per-user rate's counter), in this
-- order: loaded, the caller's bucket count, the rate, the caller's deadline, the window, the
-- per-order limit, a draw sale's pool, stock, the user's field in `users`. A first-come
-- refusal runs at most three commands (HMGET, TIME, HGET), a success six.
--
-- KEYS[1] meta    KEYS[2] users    KEYS[3] ledger    KEYS[4] pool (read when the meta has a
-- `drawEndMs`)    KEYS[5] rate: this user's attempts of the current second (when the meta has
-- a `rate`)    KEYS[6] tickets (a draw sale's); one hash tag on every key (the user's home
-- bucket in a bucketed sale)
-- ARGV[1] user id (from the verified JWT; never empty, so never the sentinel field "")
-- ARGV[2] quantity (an integer >= 1)   ARGV[3] request id (a uuid)
-- ARGV[4] deadline, ms on this server's clock: the caller stops waiting for the answer then
-- ARGV[5] the sale's bucket count the caller chose this bucket with (absent: 1)
-- ARGV[6..] credits, three arguments each: transfer id, units, load epoch (units lua/borrow.lua
--         took from other buckets for this purchase; each added to this bucket's stock once,
--         `in:<id>` in the meta, and only under the epoch it was taken in)
--
-- Returns {code, value, nowMs, epoch, credited} (credited: 1 when every credit is in this
-- bucket's stock, now or before). The codes, and `value`:
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
local meta = redis.call('HMGET', KEYS[1], 'startMs', 'endMs', 'limit', 'epoch', 'stock', 'seq',
  'buckets', 'drawEndMs', 'drawn', 'rate', 'drawAt')
if not meta[1] then return {NOT_FOUND, -1, 0, 0, 0} end
local epoch = tonumber(meta[4] or '0')
local buckets = tonumber(meta[7] or '1')
if buckets ~= tonumber(ARGV[5] or '1') then return {LAYOUT, buckets, 0, epoch, 0} end
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
      return {RATE_LIMITED, left, 0, epoch, 0}
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
if now > tonumber(ARGV[4]) then return {EXPIRED, -1, now, epoch, credited} end
if now < tonumber(meta[1]) then return {NOT_STARTED, -1, now, epoch, credited} end
if now >= tonumber(meta[2]) then return {ENDED, -1, now, epoch, credited} end
local qty = tonumber(ARGV[2])
if qty > tonumber(meta[3]) then return {QUANTITY_EXCEEDS_LIMIT, -1, now, epoch, credited} end
local draw_end = tonumber(meta[8] or '0')
if draw_end > 0 then
  -- Once a draw step ran (`drawAt`), the pool is closed even should this server's clock say
  -- otherwise (a failover to a replica whose clock is behind): an entry now could land below
  -- the cursor and never be looked at.
  if now < draw_end and not meta[11] and meta[9] ~= '1' then
    local entry = redis.call('HGET', KEYS[4], ARGV[1])
    -- A tombstone (an entry taken back after a 503) is no entry: the user may enter again.
    if entry and string.sub(entry, -2) == '|x' then entry = nil end
    if entry then
      if string.sub(entry, 1, #ARGV[3] + 1) == ARGV[3] .. '|' then
        return {QUEUED, tonumber(string.match(entry, '^[^|]*|[^|]*|([^|]*)')), now, epoch, credited}
      end
      return {ALREADY_PURCHASED, -1, now, epoch, credited}
    end
    if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return {ALREADY_PURCHASED, -1, now, epoch, credited} end
    -- The entrant's ticket: the first 52 bits (13 hex digits, exact as a score) of
    -- HMAC-SHA1(the sale's secret, user id), from the two padded keys the load wrote. The same
    -- user always gets the same ticket: an entry taken back after a 503 and made again does
    -- not draw a new one.
    local pads = redis.call('HMGET', KEYS[1], 'drawKeyI', 'drawKeyO', 'maxEntrants')
    if not pads[1] or not pads[2] then return redis.error_reply('ERR draw secret not loaded') end
    -- The sentinel is one member of `tickets`; an entrant taken back after a 503 keeps a ticket
    -- and may always come back.
    if redis.call('ZCARD', KEYS[6]) - 1 >= tonumber(pads[3] or '1000000')
        and not redis.call('ZSCORE', KEYS[6], ARGV[1]) then
      return {POOL_FULL, -1, now, epoch, credited}
    end
    local inner = (string.gsub(redis.sha1hex(pads[1] .. ARGV[1]), '%x%x',
      function(h) return string.char(tonumber(h, 16)) end))
    local ticket = tonumber(string.sub(redis.sha1hex(pads[2] .. inner), 1, 13), 16)
    local rank = redis.call('HINCRBY', KEYS[1], 'poolSize', 1)
    redis.call('HSET', KEYS[4], ARGV[1], ARGV[3] .. '|' .. qty .. '|' .. rank .. '|q')
    redis.call('ZADD', KEYS[6], ticket, ARGV[1])
    return {QUEUED, rank, now, epoch, credited}
  end
  if meta[9] ~= '1' then
    uncount()
    return {DRAW_DUE, -1, now, epoch, credited}
  end
  local entry = redis.call('HGET', KEYS[4], ARGV[1])
  if entry and string.sub(entry, -2) == '|q' then
    return {ALREADY_PURCHASED, -1, now, epoch, credited}
  end
end
local stock = tonumber(meta[5] or '0')
if stock < qty and buckets == 1 then return {SOLD_OUT, stock, now, epoch, credited} end
local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder == ARGV[3] then return {ACCEPTED, stock, now, epoch, credited} end
if holder then return {ALREADY_PURCHASED, -1, now, epoch, credited} end
if stock < qty then return {SHORT, stock, now, epoch, credited} end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], 'r|' .. ARGV[3] .. '|' .. qty .. '|' .. now)
-- One write of both: the script is atomic, so nothing moved them since the HMGET.
redis.call('HSET', KEYS[1], 'stock', stock - qty, 'seq', tonumber(meta[6] or '0') + 1)
return {ACCEPTED, stock - qty, now, epoch, credited}
