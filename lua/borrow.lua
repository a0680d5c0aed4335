-- borrow.lua: take units from this bucket of a bucketed sale for a buyer whose home bucket
-- is short (the first of a transfer's two steps; lua/purchase.lua's credits, or reconcile's
-- lua/credit.lua, are the second).
--
-- The units leave this bucket's stock and wait in this bucket's ledger, under a field no
-- user id can have, until the home bucket holds them: while the entry is there the ledger is
-- not quiet, so reconcile never corrects the stock of a sale with units in between, and a
-- crash after this step leaves an entry reconcile finishes (it credits the home bucket, which
-- takes a transfer id once, then drops the entry). A transfer id takes units once: `out:<id>`
-- in the meta records what it took for the sale's life, so a second delivery of this script
-- takes nothing and answers what the first took (the buyer's credit of it lands once).
--
-- KEYS[1] meta  KEYS[2] ledger (of this, the donor bucket)
-- ARGV[1] transfer id (uuid)   ARGV[2] units the home bucket is short of (>= 1)
-- ARGV[3] the home bucket's index   ARGV[4] the sale's bucket count, as the caller knows it
--
-- Returns {units taken (0: none here), load epoch (-1: not loaded or another layout)}.
-- The donor gives what is asked, or half its stock when that is more, so a home bucket
-- whose buyers keep coming borrows rarely; never more than it has.
local m = redis.call('HMGET', KEYS[1], 'stock', 'seq', 'epoch', 'buckets')
if not m[1] or tonumber(m[4] or '1') ~= tonumber(ARGV[4]) then return {0, -1} end
local epoch = tonumber(m[3] or '0')
local stock = tonumber(m[1])
local took = redis.call('HGET', KEYS[1], 'out:' .. ARGV[1])
if took then return {tonumber(took), epoch} end
if stock <= 0 then return {0, epoch} end
local take = math.min(stock, math.max(tonumber(ARGV[2]), math.floor(stock / 2)))
redis.call('HSET', KEYS[1], 'stock', stock - take, 'seq', tonumber(m[2] or '0') + 1,
  'out:' .. ARGV[1], take)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], ' transfer:' .. ARGV[1],
  't|' .. ARGV[1] .. '|' .. take .. '|' .. now .. '|' .. ARGV[3] .. '|' .. epoch)
return {take, epoch}
