-- outbox_take.lua: lease a draw sale's outbox and take a batch of its winners to send
-- (docs/invariants.md, "Draw admission", step 3). The lease (10 s, it lapses by itself) keeps
-- drainers from sending one batch at once; each taken winner's reservation is restamped to
-- now in this step, so reconcile's grace period counts from the send; an entry whose
-- reservation is gone is dropped.
--
-- Nothing is taken before the database holds the draw's outcome (`recorded` in the meta): a
-- drainer that finds it missing records the outcome, then calls again with ARGV[4] = the load
-- epoch of the draw it recorded, which sets `recorded` (only in a meta that is there, whose
-- draw is done, under that epoch: a sale loaded from scratch since holds another draw) before
-- it takes.
--
-- KEYS[1] ledger   KEYS[2] outbox   KEYS[3] meta
-- ARGV[1] drainer token   ARGV[2] lease ms   ARGV[3] batch size
-- ARGV[4] the load epoch of the draw whose outcome the caller committed to the database
--         ('' = none)
--
-- Returns {code, nowMs, {requestId, userId, qty, epoch, ...}}:
local BUSY = 0 -- another drainer holds the lease
local LEASED = 1 -- the batch may be empty
local UNRECORDED = 2 -- the draw's outcome is not known to be in the database: nothing taken
local now = now_ms()
-- No outbox (not a draw sale, or the sale is not loaded): nothing to take, and no lease
-- written into a key that would have no expiry.
if redis.call('EXISTS', KEYS[2]) == 0 then return {LEASED, now, {}} end
local state = redis.call('HMGET', KEYS[3], 'drawn', 'recorded', 'epoch')
if state[2] ~= '1' then
  if ARGV[4] == '' or state[1] ~= '1' or state[3] ~= ARGV[4] then return {UNRECORDED, now, {}} end
  redis.call('HSET', KEYS[3], 'recorded', '1')
end
local lease = redis.call('HGET', KEYS[2], ' lease')
if lease then
  local holder, untl = lease_fields(lease)
  if holder ~= ARGV[1] and tonumber(untl or '0') > now then return {BUSY, now, {}} end
end
redis.call('HSET', KEYS[2], ' lease', lease_value(ARGV[1], now + tonumber(ARGV[2])))
local batch, want = {}, tonumber(ARGV[3])
local cursor = '0'
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 100)
  cursor = page[1]
  local f = page[2]
  for i = 1, #f, 2 do
    local request_id, value = f[i], f[i + 1]
    if request_id ~= '' and request_id ~= ' lease' and #batch < want * 4 then
      local user, qty, epoch = outbox_fields(value)
      local entry = user and redis.call('HGET', KEYS[1], user)
      local kind, id = entry_fields(entry or '')
      if kind == 'r' and id == request_id then
        redis.call('HSET', KEYS[1], user, reservation(request_id, qty, now))
        batch[#batch + 1] = request_id
        batch[#batch + 1] = user
        batch[#batch + 1] = qty
        batch[#batch + 1] = epoch
      else
        redis.call('HDEL', KEYS[2], request_id)
      end
    end
  end
until cursor == '0' or #batch >= want * 4
return {LEASED, now, batch}
