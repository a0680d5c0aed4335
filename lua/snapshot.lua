-- snapshot.lua: read an activity's Redis state in one atomic step (reconcile, admin stats).
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   KEYS[4] outbox (a draw sale's, see draw.lua)
--
-- Returns {loaded, stock, participants, ledger, seq, unsent} where loaded is 1 when meta exists,
-- stock is -1 when the meta has no stock, participants counts the users' fields and ledger
-- is the flat HGETALL list (user, entry, ...), both without the sentinel field "" preheat.lua
-- keeps in each, and seq is the sale's stock sequence (bumped by every script that moves
-- stock). `unsent` lists the request ids in the outbox: drawn reservations waiting for
-- their order message, never stale (see outbox_take.lua).
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
