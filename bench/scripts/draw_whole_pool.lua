-- draw_whole_pool.lua: the draw as it was before it ran in steps, for the benchmark's draw
-- section only (the product's draw is lua/draw.lua): one script reads the whole pool (HGETALL),
-- shuffles it (Fisher-Yates from the caller's seed) and walks it, so its time grows with the pool.
--
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   KEYS[4] pool   KEYS[5] winners
-- ARGV[1] random seed (an integer below 2^31; the caller draws it from the OS's generator)
--
-- Returns {code, winners, units, entrants (the pool's size), msLeft}:
local OPEN = 0 -- the window is still open; msLeft until it closes
local NOW = 1 -- drawn now: winners, and the units they took
local BEFORE = 2 -- drawn before
local NOT_DRAW = 3 -- not a draw sale
local NOT_LOADED = 4
local meta = redis.call('HMGET', KEYS[1], 'drawEndMs', 'drawn', 'stock', 'seq', 'epoch')
if not meta[3] then return {NOT_LOADED, 0, 0, 0, 0} end
local draw_end = tonumber(meta[1] or '0')
if draw_end <= 0 then return {NOT_DRAW, 0, 0, 0, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local size = redis.call('HLEN', KEYS[4]) - redis.call('HEXISTS', KEYS[4], '')
if now < draw_end then return {OPEN, 0, 0, size, draw_end - now} end
if meta[2] == '1' then return {BEFORE, 0, 0, size, 0} end
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
return {NOW, winners, units, size, 0}
