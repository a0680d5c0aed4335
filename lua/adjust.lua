-- adjust.lua: apply an admin change to a loaded sale while it runs.
--
-- Stock changes are applied as a delta (never a SET, which would erase sales made meanwhile),
-- and only by the current lock owner, so a paused admin whose lease expired changes nothing.
-- Every key of the sale is given the new expiry (end + buffer): a window moved later must
-- keep `users` and the ledger as long as the meta (which holds the stock).
--
-- KEYS[1] meta (the stock is its `stock` field)   KEYS[2] lock (a hash of its holder's holds,
-- see lock_acquire.lua)   KEYS[3] users   KEYS[4] ledger
-- ARGV[1] owner   ARGV[2] stock delta (may be negative)   ARGV[3] total stock
-- ARGV[4] startMs   ARGV[5] endMs   ARGV[6] per-order limit   ARGV[7] config version
-- ARGV[8] expireAtMs   ARGV[9] change id (the fencing token, plus "-revert" for a revert)
-- ARGV[10] title (the public view reads it from the meta)
-- KEYS[5] pool   KEYS[6] outbox (a draw sale's)
-- ARGV[11] drawEndMs (0: first come, first served)   ARGV[12] per-user rate (0: none)
-- A draw sale's pool and outbox get their sentinel and the expiry like `users` and the
-- ledger, so a purchase or the draw never writes a key without an expiry.
--
-- A change is applied once: a script delivered twice (a cluster client re-sends after a
-- dropped connection) finds its change id in the meta and only answers.
--
-- Returns {code, stock}:
--   0 applied (stock = new Redis stock)      1 not the lock owner (nothing changed)
--   2 not loaded in Redis (the caller loads it)
--   3 refused: Redis stock would go below 0 (units are sold or reserved)
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return {1, -1} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {2, -1} end
local stock = tonumber(redis.call('HGET', KEYS[1], 'stock') or '0')
if redis.call('HGET', KEYS[1], 'change') == ARGV[9] then return {0, stock} end
local delta = tonumber(ARGV[2])
if stock + delta < 0 then return {3, stock} end
if delta ~= 0 then
  stock = redis.call('HINCRBY', KEYS[1], 'stock', delta)
  redis.call('HINCRBY', KEYS[1], 'seq', 1)
end
redis.call('HSET', KEYS[1], 'total', ARGV[3], 'startMs', ARGV[4], 'endMs', ARGV[5],
  'limit', ARGV[6], 'version', ARGV[7], 'expireAtMs', ARGV[8], 'change', ARGV[9],
  'title', ARGV[10], 'drawEndMs', ARGV[11], 'rate', ARGV[12])
if tonumber(ARGV[11]) > 0 then
  redis.call('HSETNX', KEYS[5], '', '-')
  redis.call('HSETNX', KEYS[6], '', '-')
end
for _, key in ipairs({KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}) do
  if redis.call('EXISTS', key) == 1 then redis.call('PEXPIREAT', key, ARGV[8]) end
end
return {0, stock}
