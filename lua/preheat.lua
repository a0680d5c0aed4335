-- preheat.lua: load one activity into Redis, idempotently, for the holder of its lock.
--
-- Loading is fenced like every admin write: only the current lock owner loads, so a load
-- computed from a database row that an admin change has since replaced cannot land (the
-- loader reads the row after taking the lock and recording its token in the database).
-- Never touches the stock of a sale already loaded (never INCR, never a reset): running
-- twice, or concurrently with purchases, changes nothing but a newer meta version and the
-- expiry. A sale that is not loaded (new, or lost by Redis) is loaded from scratch: stock =
-- the database's remaining stock, and a new load epoch from the database. Reservations made
-- under an earlier epoch were lost with it; their units are in the remaining stock again, so
-- the database refuses to commit them (the consumer's stock update requires the epoch).
-- `users` is rebuilt by the caller first (rebuild_users.lua), so no purchase runs against a
-- half-built one. `users` and the ledger get a sentinel field "" (never a user id: the auth
-- refuses an empty `sub`), so they exist with the sale's expiry from the load on and never
-- empty out and lose it: the purchase never has to check an expiry. A loaded sale gets the
-- sentinels back if they are missing, so one loaded without them heals on the next preheat.
--
-- KEYS[1] meta (the stock is its `stock` field)   KEYS[2] users   KEYS[3] ledger
-- KEYS[4] lock (a hash of its holder's holds, see lock_acquire.lua)
-- (In a bucketed sale, the keys of one bucket, and for the lock the holder's stamp there.)
-- ARGV[1] stock to load (DB remaining stock; in a bucketed sale this bucket's share of it)
-- ARGV[2] total stock
-- ARGV[3] startMs   ARGV[4] endMs   ARGV[5] per-order limit   ARGV[6] config version
-- ARGV[7] expireAtMs (sale end + buffer)   ARGV[8] lock owner   ARGV[9] load epoch
-- ARGV[10] title (the public view reads it from the meta)
-- ARGV[11] the sale's bucket count (a load from scratch writes it; the count of a loaded
--          bucket never changes: a sale loaded with another count is unloaded first)
-- KEYS[5] pool   KEYS[6] outbox (a draw sale's; see draw.lua)
-- ARGV[12] drawEndMs (0: first come, first served)   ARGV[13] per-user rate per second (0: none)
-- A draw sale's pool and outbox get a sentinel and the expiry like `users` and the ledger.
--
-- Returns 1 = loaded now, 0 = already loaded (unchanged but the expiry and the sentinels), 2 = already loaded,
-- meta refreshed to a newer version, 3 = not the lock owner (nothing changed).
if redis.call('HEXISTS', KEYS[4], ARGV[8]) == 0 then return 3 end
local function expire_all()
  redis.call('HSETNX', KEYS[2], '', '-')
  redis.call('HSETNX', KEYS[3], '', '-')
  for i = 1, 3 do redis.call('PEXPIREAT', KEYS[i], ARGV[7]) end
  if tonumber(ARGV[12] or '0') > 0 then
    for i = 5, 6 do
      redis.call('HSETNX', KEYS[i], '', '-')
      redis.call('PEXPIREAT', KEYS[i], ARGV[7])
    end
  end
end
local version = redis.call('HGET', KEYS[1], 'version')
if version then
  if tonumber(ARGV[6]) > tonumber(version) then
    redis.call('HSET', KEYS[1], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
      'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7], 'title', ARGV[10],
      'drawEndMs', ARGV[12], 'rate', ARGV[13])
    expire_all()
    return 2
  end
  expire_all()
  return 0
end
redis.call('HSET', KEYS[1], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
  'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7], 'epoch', ARGV[9],
  'stock', ARGV[1], 'title', ARGV[10], 'buckets', ARGV[11], 'drawEndMs', ARGV[12],
  'rate', ARGV[13])
redis.call('HINCRBY', KEYS[1], 'seq', 1)
expire_all()
return 1
