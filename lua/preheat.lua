-- preheat.lua: load one bucket of a sale into Redis, idempotently, for the holder of its lock
-- (docs/invariants.md, "Load", step 4, and "Key lifetimes"). Never touches the stock of a
-- loaded bucket: the database's meta version replaces any other, missing sentinels (`""`, never a
-- user id) go back, every key is re-expired. A bucket not loaded gets its stock, epoch and
-- meta from the database row; its `users` was rebuilt first (rebuild_users.lua).
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   KEYS[4] lock (or its stamp in this bucket)
-- KEYS[5] pool   KEYS[6] winners   KEYS[7] tickets (a draw sale's)
-- ARGV[1] stock to load (this bucket's share of the database's remaining)   ARGV[2] total
-- ARGV[3] startMs   ARGV[4] endMs   ARGV[5] per-order limit   ARGV[6] config version
-- ARGV[7] expireAtMs (sale end + buffer)   ARGV[8] lock owner   ARGV[9] load epoch
-- ARGV[10] title   ARGV[11] the sale's bucket count   ARGV[12] drawEndMs (0: first come,
-- first served)   ARGV[13] per-user rate per second (0: none)   ARGV[14] a unit's price in
-- minor units   ARGV[15] its currency (both shown by the public view)   the sale's ticket
-- secret: ARGV[16] and ARGV[17] HMAC-SHA1's inner and outer padded keys (64 bytes each),
-- ARGV[18] its SHA-256 (public), ARGV[19] the secret (hex; public once the draw is done);
-- every sale has one   ARGV[20] the most entrants a draw sale's pool takes
--
-- Returns:
local ALREADY_LOADED = 0 -- unchanged but the expiry and the sentinels
local LOADED = 1
local META_REFRESHED = 2 -- already loaded, the meta replaced by the database's version
local NOT_OWNER = 3 -- nothing changed
if redis.call('HEXISTS', KEYS[4], ARGV[8]) == 0 then return NOT_OWNER end
-- Every sale's meta holds its ticket secret, written by every run (a first-come sale an admin
-- turns into a draw before its start needs it); only a draw sale's public view shows any of it.
local function draw_secret()
  redis.call('HSET', KEYS[1], 'drawKeyI', ARGV[16], 'drawKeyO', ARGV[17], 'drawCommit', ARGV[18],
    'drawSecret', ARGV[19])
end
local function expire_all()
  draw_secret()
  redis.call('HSETNX', KEYS[2], '', '-')
  redis.call('HSETNX', KEYS[3], '', '-')
  for i = 1, 3 do redis.call('PEXPIREAT', KEYS[i], ARGV[7]) end
  if tonumber(ARGV[12] or '0') > 0 then
    for i = 5, 6 do
      redis.call('HSETNX', KEYS[i], '', '-')
      redis.call('PEXPIREAT', KEYS[i], ARGV[7])
    end
    redis.call('ZADD', KEYS[7], 'NX', -1, '')
    redis.call('PEXPIREAT', KEYS[7], ARGV[7])
  end
end
local version = redis.call('HGET', KEYS[1], 'version')
if version then
  -- Any other version is replaced, a newer one too: the database's row read under this lock
  -- is the truth, and a change whose commit never happened can have left its meta here.
  if tonumber(ARGV[6]) ~= tonumber(version) then
    redis.call('HSET', KEYS[1], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
      'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7], 'title', ARGV[10],
      'drawEndMs', ARGV[12], 'rate', ARGV[13], 'price', ARGV[14], 'currency', ARGV[15],
      'maxEntrants', ARGV[20],
      'terms', sale_terms(ARGV[6], ARGV[3], ARGV[4], ARGV[5], ARGV[12], ARGV[13]))
    expire_all()
    return META_REFRESHED
  end
  -- A meta whose `terms` are missing or not its fields' (written by a build before them, or
  -- a writer since that did not know them) gets those of its own fields.
  local terms = terms_of_fields(KEYS[1])
  if redis.call('HGET', KEYS[1], 'terms') ~= terms then
    redis.call('HSET', KEYS[1], 'terms', terms)
  end
  expire_all()
  return ALREADY_LOADED
end
redis.call('HSET', KEYS[1], 'total', ARGV[2], 'startMs', ARGV[3], 'endMs', ARGV[4],
  'limit', ARGV[5], 'version', ARGV[6], 'expireAtMs', ARGV[7], 'epoch', ARGV[9],
  'stock', ARGV[1], 'title', ARGV[10], 'buckets', ARGV[11], 'drawEndMs', ARGV[12],
  'rate', ARGV[13], 'price', ARGV[14], 'currency', ARGV[15], 'maxEntrants', ARGV[20],
  'terms', sale_terms(ARGV[6], ARGV[3], ARGV[4], ARGV[5], ARGV[12], ARGV[13]),
  'fitCounts', '1') -- its pool's entries are counted by units asked (prelude, count_entry)
redis.call('HINCRBY', KEYS[1], 'seq', 1)
-- A draw sale's pool is rebuilt from the database's entries (pool_restore.lua, from the
-- cursor `restoreAt`); its draw waits until the rebuild is whole and drops the cursor.
if tonumber(ARGV[12] or '0') > 0 then redis.call('HSET', KEYS[1], 'restoreAt', '0') end
expire_all()
return LOADED
