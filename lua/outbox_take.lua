-- outbox_take.lua: lease a draw sale's outbox and take a batch of its winners to send.
--
-- The outbox names the winners whose order message is not known to be on the queue. A
-- drainer takes a batch, sends it, then drops what it sent (outbox_done.lua); a crash in
-- between leaves the entries here for the next drainer (at least once: the consumer is
-- idempotent per request id). The lease keeps concurrent drainers (the entry function that
-- ran the draw, others that saw a pending outbox, reconcile) from sending the same batch at
-- once; it lapses by itself, so a drainer that died holds nothing for long.
--
-- Each taken winner's reservation is restamped to now before its message is sent, in this
-- step. Reconcile's grace period then counts from the send, not from the draw, and a snapshot
-- of the ledger and outbox together (snapshot.lua) shows every drawn reservation either
-- still in the outbox (never stale) or stamped no earlier than its send. An entry whose
-- reservation is gone (given back, or settled by a message an earlier drainer sent) is
-- dropped.
--
-- KEYS[1] ledger   KEYS[2] outbox
-- ARGV[1] drainer token   ARGV[2] lease ms   ARGV[3] batch size
--
-- Returns {code, nowMs, {requestId, userId, qty, epoch, ...}}: code 1 = leased (the batch may
-- be empty), 0 = another drainer holds the lease.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- No outbox (not a draw sale, or the sale is not loaded): nothing to take, and no lease
-- written into a key that would have no expiry.
if redis.call('EXISTS', KEYS[2]) == 0 then return {1, now, {}} end
local lease = redis.call('HGET', KEYS[2], ' lease')
if lease then
  local holder, untl = string.match(lease, '^([^|]*)|(%d+)$')
  if holder ~= ARGV[1] and tonumber(untl or '0') > now then return {0, now, {}} end
end
redis.call('HSET', KEYS[2], ' lease', ARGV[1] .. '|' .. (now + tonumber(ARGV[2])))
local batch, want = {}, tonumber(ARGV[3])
local cursor = '0'
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 100)
  cursor = page[1]
  local f = page[2]
  for i = 1, #f, 2 do
    local request_id, value = f[i], f[i + 1]
    if request_id ~= '' and request_id ~= ' lease' and #batch < want * 4 then
      local user, qty, epoch = string.match(value, '^(.*)|(%d+)|(%d+)$')
      local entry = user and redis.call('HGET', KEYS[1], user)
      if entry and string.sub(entry, 1, #request_id + 3) == 'r|' .. request_id .. '|' then
        redis.call('HSET', KEYS[1], user, 'r|' .. request_id .. '|' .. qty .. '|' .. now)
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
return {1, now, batch}
