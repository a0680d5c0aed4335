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
-- The user set is rebuilt by the caller first (rebuild_users.lua), so no purchase runs
-- against a half-built set.
--
-- KEYS[1] stock   KEYS[2] meta   KEYS[3] users   KEYS[4] ledger
-- KEYS[5] lock (a hash of its holder's holds, see lock_acquire.lua)
-- ARGV[1] stock to load (DB remaining stock)   ARGV[2] total stock
-- ARGV[3] startMs   ARGV[4] endMs   ARGV[5] per-order limit   ARGV[6] config version
-- ARGV[7] expireAtMs (sale end + buffer)   ARGV[8] lock owner   ARGV[9] load epoch
-- ARGV[10] title (the public view reads it from the meta)
--
-- Returns 1 = loaded now, 0 = already loaded (unchanged but the expiry), 2 = already loaded,
-- meta refreshed to a newer version, 3 = not the lock owner (nothing changed).
if redis.call('HEXISTS', KEYS[5], ARGV[8]) == 0 then return 3 end
local function expire_all()
  for i = 1, 4 do
    if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('PEXPIREAT', KEYS[i], ARGV[7]) end
  end
end
local version = redis.call('HGET', KEYS[2], 'version')
if version then
  if tonumber(ARGV[6]) > tonumber(version) then
    redis.call('HSET', KEYS[2], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
      'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7], 'title', ARGV[10])
    expire_all()
    return 2
  end
  expire_all()
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
  'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7], 'epoch', ARGV[9],
  'title', ARGV[10])
redis.call('HINCRBY', KEYS[2], 'seq', 1)
expire_all()
return 1
