-- snapshot_whole_ledger.lua: the snapshot reconcile took before the ledger was read in chunks
-- (the baseline of make bench's reconcile section): every ledger entry in one script, its cost
-- growing with the ledger.
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   KEYS[4] winners (a draw sale's)
--
-- Returns {loaded (1: the meta exists), stock (-1: none), participants (the users' fields),
-- ledger (flat: user, entry, ...), seq (the stock sequence), unsent (the request ids in the
-- outbox: drawn reservations waiting for their message, never stale)}; the sentinel "" never
-- counted.
local loaded = redis.call('EXISTS', KEYS[1])
local stock = tonumber(redis.call('HGET', KEYS[1], 'stock') or '-1')
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local participants = redis.call('HLEN', KEYS[2]) - redis.call('HEXISTS', KEYS[2], '')
local flat = redis.call('HGETALL', KEYS[3])
local ledger = {}
for i = 1, #flat, 2 do
  if flat[i] ~= '' then
    ledger[#ledger + 1] = flat[i]
    ledger[#ledger + 1] = flat[i + 1]
  end
end
local unsent = {}
if KEYS[4] then
  for _, id in ipairs(redis.call('HKEYS', KEYS[4])) do
    if id ~= '' and id ~= ' lease' then unsent[#unsent + 1] = id end
  end
end
return {loaded, stock, participants, ledger, seq, unsent}
