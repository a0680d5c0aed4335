-- cancel_begin.lua: announce one cancel attempt in the ledger before the database commits it.
--
-- While the entry is there the ledger is not quiet, so reconcile will not "correct" Redis
-- stock from a database that is already ahead of Redis. The entry carries the attempt's own
-- cancel id; the database records the id of the attempt that committed, and only that
-- attempt's entry is ever finished (cancel_finish.lua), so a late or second canceller can
-- never give the units back again.
--
-- A live order's user holds the sale's quota through it: the user's field in `users` names
-- the order's request id. A field that does not (gone, or naming a later purchase) means this
-- order no longer holds anything in Redis (another attempt cancelled it and finished): the
-- attempt stops there and writes nothing, so it can neither re-add the user nor leave an
-- entry without the user's field (a purchase reads only `users`).
--
-- KEYS[1] meta   KEYS[2] ledger   KEYS[3] users
-- ARGV[1] user id   ARGV[2] cancel id   ARGV[3] quantity   ARGV[4] now (ms)   ARGV[5] order id
-- ARGV[6] the order's request id
--
-- Entry written: "c|<cancelId>|<qty>|<ms>|<orderId>".
-- Returns {code, epoch}: code 1 = recorded, 0 = another entry of the user is in flight (retry
-- later; a second canceller never adopts the first one's entry), 2 = activity not loaded in
-- Redis, 3 = the user's field does not name this order's request (nothing written). epoch = the sale's load epoch: the database commit requires it unchanged, so a
-- cancel whose entry was lost with a Redis that has since been reloaded cannot commit.
if redis.call('EXISTS', KEYS[1]) == 0 then return {2, 0} end
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[6] then return {3, epoch} end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v then
  local kind, id = string.match(v, '^(%a)|([^|]+)|')
  -- An orphan check's mark gives way: the check sees its mark gone and leaves the user be.
  -- The order's own reservation gives way too: the order row proves the database holds it.
  if not (kind == 'x' or (kind == 'r' and id == ARGV[6])) then return {0, epoch} end
end
redis.call('HSET', KEYS[2], ARGV[1],
  'c|' .. ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|' .. ARGV[5])
return {1, epoch}
