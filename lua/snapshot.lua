-- snapshot.lua: an activity's Redis state in one atomic step (reconcile, admin stats).
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger
-- ARGV[1] the most ledger entries returned here: a larger ledger is not read by this script
-- (its cost would grow with the crowd) but by the caller, in chunks.
--
-- Returns {loaded (1: the meta exists), stock (-1: none), participants (the users' fields),
-- ledger (flat: user, entry, ...; empty when the ledger holds more than ARGV[1] entries), seq
-- (the stock sequence), held (1: a draw sale whose winners' orders are not all written yet:
-- its reservations are the drawer's to settle, never stale), size (the ledger's entries)};
-- the sentinel "" never counted.
local loaded = redis.call('EXISTS', KEYS[1])
local meta = redis.call('HMGET', KEYS[1], 'stock', 'seq', 'drawEndMs', 'written')
local stock = tonumber(meta[1] or '-1')
local seq = tonumber(meta[2] or '0')
local held = 0
if tonumber(meta[3] or '0') > 0 and meta[4] ~= '1' then held = 1 end
local participants = redis.call('HLEN', KEYS[2]) - redis.call('HEXISTS', KEYS[2], '')
local size = redis.call('HLEN', KEYS[3]) - redis.call('HEXISTS', KEYS[3], '')
local ledger = {}
if size <= tonumber(ARGV[1]) then
  local flat = redis.call('HGETALL', KEYS[3])
  for i = 1, #flat, 2 do
    if flat[i] ~= '' then
      ledger[#ledger + 1] = flat[i]
      ledger[#ledger + 1] = flat[i + 1]
    end
  end
end
return {loaded, stock, participants, ledger, seq, held, size}
