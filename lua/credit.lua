-- credit.lua: put a transfer's units into its home bucket, once: the second step of a
-- transfer between buckets when reconcile finishes one a buyer left (a buyer's own credits
-- ride on purchase.lua by the same rule). `in:<id>` in the meta takes an id once; only under
-- the load epoch the units were taken in. docs/invariants.md, "Bucketed sales".
--
-- KEYS[1] meta of the home bucket
-- ARGV[1] transfer id   ARGV[2] units   ARGV[3] the load epoch of the borrow
--
-- Returns:
local NOT_LOADED = 0
local NOW = 1 -- credited now
local BEFORE = 2 -- credited before
local OTHER_EPOCH = 3 -- the bucket was loaded again since: its stock already holds the units
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return NOT_LOADED end
if tonumber(epoch) ~= tonumber(ARGV[3]) then return OTHER_EPOCH end
if redis.call('HSETNX', KEYS[1], 'in:' .. ARGV[1], ARGV[2]) == 0 then return BEFORE end
add_stock(KEYS[1], tonumber(ARGV[2]))
return NOW
