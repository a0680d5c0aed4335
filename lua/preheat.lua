-- preheat.lua: load one activity into Redis, idempotently.
--
-- Never resets the stock of a sale already loaded (SET NX, never INCR): running twice, or
-- concurrently with itself or with purchases, changes nothing but a newer meta version.
--
-- KEYS[1] stock   KEYS[2] meta   KEYS[3] users   KEYS[4] ledger
-- ARGV[1] stock to load (DB remaining stock)   ARGV[2] total stock
-- ARGV[3] startMs   ARGV[4] endMs   ARGV[5] per-order limit   ARGV[6] config version
-- ARGV[7] expireAtMs (sale end + buffer)
--
-- Returns 1 = loaded now, 0 = already loaded (unchanged), 2 = already loaded, meta refreshed
-- to a newer version.
local function expire_all()
  for i = 1, 4 do
    if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('PEXPIREAT', KEYS[i], ARGV[7]) end
  end
end
local version = redis.call('HGET', KEYS[2], 'version')
if version then
  if tonumber(ARGV[6]) > tonumber(version) then
    redis.call('HSET', KEYS[2], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
      'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7])
    expire_all()
    return 2
  end
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'NX')
redis.call('HSET', KEYS[2], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
  'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7])
expire_all()
return 1
