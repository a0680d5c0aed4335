-- snapshot.lua: read an activity's Redis state in one atomic step (reconcile, admin stats).
--
-- KEYS[1] stock   KEYS[2] meta   KEYS[3] users   KEYS[4] ledger
--
-- Returns {loaded, stock, participants, ledger, seq} where loaded is 1 when meta exists,
-- stock is -1 when the stock key is missing, ledger is the flat HGETALL list (user, entry,
-- ...) and seq is the sale's stock sequence (bumped by every script that moves stock).
local loaded = redis.call('EXISTS', KEYS[2])
local stock = tonumber(redis.call('GET', KEYS[1]) or '-1')
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0')
return {loaded, stock, redis.call('SCARD', KEYS[3]), redis.call('HGETALL', KEYS[4]), seq}
