-- adjust.lua: apply an admin change to a loaded sale, for the lock's owner only, once per
-- change id (a script delivered twice only answers). Stock moves by a delta, never a SET, so
-- sales made meanwhile stay; every key of the sale gets the new expiry. docs/invariants.md,
-- "Admin".
--
-- KEYS[1] meta   KEYS[2] lock (its holder's holds, see lock_acquire.lua)   KEYS[3] users
-- KEYS[4] ledger   KEYS[5] pool   KEYS[6] winners   KEYS[7] tickets (a draw sale's)
-- ARGV[1] owner   ARGV[2] stock delta (may be negative)   ARGV[3] total stock
-- ARGV[4] startMs   ARGV[5] endMs   ARGV[6] per-order limit   ARGV[7] config version
-- ARGV[8] expireAtMs   ARGV[9] change id   ARGV[10] title   ARGV[11] drawEndMs (0: first
-- come, first served)   ARGV[12] per-user rate (0: none)   ARGV[13] a unit's price in minor
-- units   ARGV[14] its currency   ARGV[15] the most entrants a draw sale's pool takes
--
-- Returns {code, stock}:
local APPLIED = 0 -- stock = the new Redis stock
local NOT_OWNER = 1 -- nothing changed
local NOT_LOADED = 2 -- the caller loads the sale
local WOULD_GO_NEGATIVE = 3 -- refused: units are sold or reserved; stock = the Redis stock
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return {NOT_OWNER, -1} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {NOT_LOADED, -1} end
local stock = tonumber(redis.call('HGET', KEYS[1], 'stock') or '0')
if redis.call('HGET', KEYS[1], 'change') == ARGV[9] then return {APPLIED, stock} end
local delta = tonumber(ARGV[2])
if stock + delta < 0 then return {WOULD_GO_NEGATIVE, stock} end
if delta ~= 0 then
  stock = add_stock(KEYS[1], delta)
end
redis.call('HSET', KEYS[1], 'total', ARGV[3], 'startMs', ARGV[4], 'endMs', ARGV[5],
  'limit', ARGV[6], 'version', ARGV[7], 'expireAtMs', ARGV[8], 'change', ARGV[9],
  'title', ARGV[10], 'drawEndMs', ARGV[11], 'rate', ARGV[12], 'price', ARGV[13],
  'currency', ARGV[14], 'maxEntrants', ARGV[15],
  'terms', sale_terms(ARGV[7], ARGV[4], ARGV[5], ARGV[6], ARGV[11], ARGV[12]))
if tonumber(ARGV[11]) > 0 then
  redis.call('HSETNX', KEYS[5], '', '-')
  redis.call('HSETNX', KEYS[6], '', '-')
  redis.call('ZADD', KEYS[7], 'NX', -1, '')
end
for _, key in ipairs({KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]}) do
  if redis.call('EXISTS', key) == 1 then redis.call('PEXPIREAT', key, ARGV[8]) end
end
return {APPLIED, stock}
