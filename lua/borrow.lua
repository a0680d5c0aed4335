-- borrow.lua: take units from this bucket for a buyer whose home bucket is short, the first
-- step of a transfer between buckets (docs/invariants.md, "Bucketed sales"). The units leave
-- the stock and wait in this bucket's ledger under `' transfer:<id>'` until the home bucket
-- holds them; `out:<id>` in the meta makes a second delivery take nothing and answer what the
-- first took. The donor gives what is asked, or half its stock when that is more.
--
-- KEYS[1] meta  KEYS[2] ledger (of this, the donor bucket)
-- ARGV[1] transfer id (uuid)   ARGV[2] units the home bucket is short of (>= 1)
-- ARGV[3] the home bucket's index   ARGV[4] the sale's bucket count, as the caller knows it
--
-- Returns {units taken, load epoch (-1: not loaded or another layout)}:
local NOTHING = 0 -- no units taken
local m = redis.call('HMGET', KEYS[1], 'stock', 'seq', 'epoch', 'buckets')
if not m[1] or tonumber(m[4] or '1') ~= tonumber(ARGV[4]) then return {NOTHING, -1} end
local epoch = tonumber(m[3] or '0')
local stock = tonumber(m[1])
local took = redis.call('HGET', KEYS[1], 'out:' .. ARGV[1])
if took then return {tonumber(took), epoch} end
if stock <= 0 then return {NOTHING, epoch} end
local take = math.min(stock, math.max(tonumber(ARGV[2]), math.floor(stock / 2)))
put_stock(KEYS[1], stock - take, tonumber(m[2] or '0'), 'out:' .. ARGV[1], take)
local now = now_ms()
redis.call('HSET', KEYS[2], ' transfer:' .. ARGV[1],
  transfer_entry(ARGV[1], take, now, ARGV[3], epoch))
return {take, epoch}
