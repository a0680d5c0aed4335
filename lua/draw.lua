-- draw.lua: one bounded step of a draw sale's draw, once its window has closed (docs/
-- invariants.md, "Draw admission", step 2). The entrants are taken in the order of their
-- tickets (`tickets`, lowest first; a ticket is HMAC-SHA1 of the sale's secret and the user id,
-- so the order is fixed by the secret and nobody's arrival changes it), at most ARGV[1] of them
-- per call from the cursor `drawAt` in the meta: an entrant whose entry is still queued, whose
-- quantity fits the stock left and who holds nothing yet wins what a first-come purchase gets
-- (the field in `users`, an `r` reservation entry, the units) plus its entry in `winners`;
-- any other is passed over. The draw is done when the stock is gone, every ticket was seen,
-- or no queued entry the cursor has not passed asks for the stock left or fewer units (the
-- meta's counts by units asked, `q:<units>`, and their lower bound `fitMin`, which each call
-- moves up past empty counts within its budget: the walk stops where its outcome is known):
-- the meta's `drawn` flag makes the losers final (their entries stay `q`: not drawn), and
-- `drawCutoff` keeps the last ticket the draw looked at (every ticket above it lost). Each call
-- is atomic and moves the cursor with what it wrote; a call after the draw is done changes
-- nothing, and a crash between calls loses nothing: the next call goes on from the cursor.
-- The tickets are never removed during the draw (an entry taken back leaves the pool hash
-- only), so the cursor's index always means the same ticket.
--
-- After a load from scratch the meta holds `waitEntries`: entries answered 202 may still be on
-- the queue, on their way back into the pool; no step runs until the drawer, having found
-- them written (or its wait bound passed), calls with ARGV[2] = '1', which ends the wait.
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   KEYS[4] pool   KEYS[5] winners   KEYS[6] tickets
-- ARGV[1] how many tickets this call may look at (>= 1)
-- ARGV[2] '1' = the wait for the queued entries is over
--
-- Returns {code, winners, units, entrants (the pool's size), msLeft}:
local OPEN = 0 -- the window is still open; msLeft until it closes
local STEP = 1 -- this call drew `winners` taking `units`; the draw is not done
local BEFORE = 2 -- the draw was done before this call
local NOT_DRAW = 3 -- not a draw sale
local NOT_LOADED = 4
local DONE = 5 -- this call drew `winners` taking `units`, and finished the draw
local RESTORING = 6 -- the sale was loaded from scratch and its pool is being rebuilt from the
                    -- database's entries: no step runs until it is whole
local WAITING = 7 -- rebuilt: no step runs until the drawer ends the wait for queued entries
local meta = redis.call('HMGET', KEYS[1], 'drawEndMs', 'drawn', 'stock', 'seq', 'epoch', 'drawAt',
  'restoreAt', 'waitEntries', 'fitCounts', 'fitMin')
if not meta[3] then return {NOT_LOADED, 0, 0, 0, 0} end
local draw_end = tonumber(meta[1] or '0')
if draw_end <= 0 then return {NOT_DRAW, 0, 0, 0, 0} end
local now = now_ms()
local function entrants()
  return math.max(redis.call('ZCARD', KEYS[6]) - redis.call('ZCOUNT', KEYS[6], -1, -1), 0)
end
-- Done is final, whatever this server's clock says (a sale loaded drawn from the recorded
-- outcome, a failover to a replica whose clock is behind).
if meta[2] == '1' then return {BEFORE, 0, 0, entrants(), 0} end
if now < draw_end then return {OPEN, 0, 0, entrants(), draw_end - now} end
if meta[7] then return {RESTORING, 0, 0, entrants(), 0} end
if meta[8] then
  if ARGV[2] ~= '1' then return {WAITING, 0, 0, entrants(), 0} end
  redis.call('HDEL', KEYS[1], 'waitEntries')
end
-- The sentinel '' has the lowest score, -1: index 0 (back if it went, before the cursor moved).
redis.call('ZADD', KEYS[6], 'NX', -1, '')
local size = redis.call('ZCARD', KEYS[6]) - 1

local stock = tonumber(meta[3])
local epoch = meta[5] or '0'
local at = tonumber(meta[6] or '1')
local budget = tonumber(ARGV[1])
local winners, units = 0, 0
local last = nil
-- Whether no queued entry ahead of the cursor fits the stock left: `fitMin` moves up past
-- the units nobody ahead asks for (one HGET each, out of this call's budget) until it meets a
-- count or passes the stock. Unknown (false) in a meta that does not count its entries.
local function nothing_fits()
  if meta[9] ~= '1' then return false end
  local low = tonumber(meta[10] or '')
  if not low then return true end -- nobody was counted: no queued entry at all
  local from = low
  while low <= stock and budget > 0 do
    if tonumber(redis.call('HGET', KEYS[1], 'q:' .. low) or '0') > 0 then break end
    low, budget = low + 1, budget - 1
  end
  if low > from then
    redis.call('HSET', KEYS[1], 'fitMin', low)
    meta[10] = tostring(low)
  end
  return low > stock
end
local done = stock <= 0 or nothing_fits()
if not done and budget > 0 then
  local slice = redis.call('ZRANGE', KEYS[6], at, at + budget - 1, 'WITHSCORES')
  for i = 1, #slice, 2 do
    local user, score = slice[i], slice[i + 1]
    at, last = at + 1, score
    local request_id, qty, rank, state = pool_fields(redis.call('HGET', KEYS[4], user) or '')
    if state == 'q' then uncount_entry(KEYS[1], qty) end
    qty = state == 'q' and tonumber(qty)
    -- A user holding an order already (the sale was reloaded from the database meanwhile) is
    -- passed over: one order per user. So is an entry taken back (no pool entry) or won.
    if qty and qty <= stock and redis.call('HEXISTS', KEYS[2], user) == 0 then
      redis.call('HSET', KEYS[2], user, request_id)
      redis.call('HSET', KEYS[3], user, reservation(request_id, qty, now))
      redis.call('HSET', KEYS[5], request_id, winner_entry(user, qty, epoch))
      redis.call('HSET', KEYS[4], user, pool_entry(request_id, qty, rank, 'w'))
      stock = stock - qty
      winners, units = winners + 1, units + qty
      if stock <= 0 then break end
    end
  end
end
if units > 0 then put_stock(KEYS[1], stock, tonumber(meta[4] or '0')) end
redis.call('HSET', KEYS[1], 'drawAt', at)
if last then redis.call('HSET', KEYS[1], 'drawCutoff', last) end
if done or stock <= 0 or at > size or nothing_fits() then
  redis.call('HSET', KEYS[1], 'drawn', '1')
  return {DONE, winners, units, size, 0}
end
return {STEP, winners, units, size, 0}
