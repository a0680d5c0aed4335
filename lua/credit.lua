-- credit.lua: put a transfer's units into its home bucket, once (the second step of a
-- transfer between buckets, when reconcile finishes one whose buyer never did; a buyer's own
-- credits ride on lua/purchase.lua, which applies them by the same rule).
--
-- The home bucket takes a transfer id once (`in:<id>` in its meta, for the sale's life), and
-- only under the load epoch the units were taken in: a bucket loaded again since holds a
-- stock read from the database, in which those units already are.
--
-- KEYS[1] meta of the home bucket
-- ARGV[1] transfer id   ARGV[2] units   ARGV[3] the load epoch of the borrow
--
-- Returns 1 credited now, 2 credited before, 0 the bucket is not loaded, 3 another epoch.
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return 0 end
if tonumber(epoch) ~= tonumber(ARGV[3]) then return 3 end
if redis.call('HSETNX', KEYS[1], 'in:' .. ARGV[1], ARGV[2]) == 0 then return 2 end
redis.call('HINCRBY', KEYS[1], 'stock', tonumber(ARGV[2]))
redis.call('HINCRBY', KEYS[1], 'seq', 1)
return 1
