-- draw.lua: a draw sale's draw, once, when its window has closed.
--
-- The pool holds the purchases of the draw window (lua/purchase.lua). The draw shuffles it
-- (Fisher-Yates, from the caller's random seed) and walks the shuffled pool: an entrant whose
-- quantity fits in the stock left wins, one that does not is passed over, until the stock is
-- covered or the pool is walked. A winner gets what a first-come purchase gets, in the same
-- step: their field in `users`, a reservation in the ledger (`r|requestId|qty|ms`), the units
-- taken from the stock. And an outbox entry: its order message is still to be sent (by
-- whoever drains the outbox, see outbox_take.lua). The pool entry becomes `w`; a loser's
-- stays `q`, which the set `drawn` flag makes final. Nothing waits on a schedule: the first
-- purchase after the window (code 11 of purchase.lua), a pool entrant asking for their status
-- or reconcile runs it, and running it again changes nothing.
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   KEYS[4] pool   KEYS[5] outbox
-- ARGV[1] random seed (an integer below 2^31; the caller draws it from the OS's generator)
--
-- Returns {code, winners, units, entrants, msLeft}:
--   0 the window is still open (msLeft: until it closes)   1 drawn now
--   2 drawn before (winners and units: 0)   3 not a draw sale   4 not loaded
--   entrants: the pool's size; on 1 winners and the units they took.
local meta = redis.call('HMGET', KEYS[1], 'drawEndMs', 'drawn', 'stock', 'seq', 'epoch')
if not meta[3] then return {4, 0, 0, 0, 0} end
local draw_end = tonumber(meta[1] or '0')
if draw_end <= 0 then return {3, 0, 0, 0, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local size = redis.call('HLEN', KEYS[4]) - redis.call('HEXISTS', KEYS[4], '')
if now < draw_end then return {0, 0, 0, size, draw_end - now} end
if meta[2] == '1' then return {2, 0, 0, size, 0} end
redis.call('HSET', KEYS[1], 'drawn', '1')

local flat = redis.call('HGETALL', KEYS[4])
local pool = {}
for i = 1, #flat, 2 do
  if flat[i] ~= '' and string.sub(flat[i + 1], -2) == '|q' then
    pool[#pool + 1] = {flat[i], flat[i + 1]}
  end
end
-- The caller's seed makes this draw's shuffle its own, and a test's repeatable.
math.randomseed(tonumber(ARGV[1]))
for i = #pool, 2, -1 do
  local j = math.random(i)
  pool[i], pool[j] = pool[j], pool[i]
end

local stock = tonumber(meta[3])
local epoch = meta[5] or '0'
local winners, units = 0, 0
for _, e in ipairs(pool) do
  if stock <= 0 then break end
  local user, value = e[1], e[2]
  local request_id, qty, rank = string.match(value, '^([^|]+)|(%d+)|(%d+)|q$')
  qty = tonumber(qty)
  -- A user holding an order already (the sale was reloaded from the database meanwhile) is
  -- passed over: one order per user. So is an entry that does not read (none does: only
  -- purchase.lua writes them), before anything is written for it.
  if qty and qty <= stock and redis.call('HEXISTS', KEYS[2], user) == 0 then
    redis.call('HSET', KEYS[2], user, request_id)
    redis.call('HSET', KEYS[3], user, 'r|' .. request_id .. '|' .. qty .. '|' .. now)
    redis.call('HSET', KEYS[5], request_id, user .. '|' .. qty .. '|' .. epoch)
    redis.call('HSET', KEYS[4], user, request_id .. '|' .. qty .. '|' .. rank .. '|w')
    stock = stock - qty
    winners, units = winners + 1, units + qty
  end
end
if units > 0 then
  redis.call('HSET', KEYS[1], 'stock', stock, 'seq', tonumber(meta[4] or '0') + 1)
end
return {1, winners, units, size, 0}
