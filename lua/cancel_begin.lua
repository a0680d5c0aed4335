-- cancel_begin.lua: announce one cancel attempt in the ledger, a `c` entry with its cancel id,
-- before the database commits it (docs/invariants.md, "Cancel", step 1). Only while the
-- user's field in `users` names the order's request id: otherwise the order holds nothing in
-- Redis any more (or Redis lost the field, which the caller restores first) and nothing is
-- written. A check's mark and the order's own reservation give way; any other entry of the
-- user is another attempt in flight.
--
-- KEYS[1] meta   KEYS[2] ledger   KEYS[3] users
-- ARGV[1] user id   ARGV[2] cancel id   ARGV[3] quantity   ARGV[4] now (ms)   ARGV[5] order id
-- ARGV[6] the order's request id
--
-- Returns {code, epoch}, epoch the sale's load epoch (the commit requires it unchanged):
local BUSY = 0 -- another entry of the user is in flight; retry later
local RECORDED = 1
local NOT_LOADED = 2 -- the sale is not in Redis
local NOT_HELD = 3 -- the user's field does not name this order's request; nothing written
if redis.call('EXISTS', KEYS[1]) == 0 then return {NOT_LOADED, 0} end
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[6] then return {NOT_HELD, epoch} end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v then
  local kind, id = entry_fields(v)
  -- An orphan check's mark gives way: the check sees its mark gone and leaves the user be.
  -- The order's own reservation gives way too: the order row proves the database holds it.
  if not (kind == 'x' or (kind == 'r' and id == ARGV[6])) then return {BUSY, epoch} end
end
redis.call('HSET', KEYS[2], ARGV[1], cancel_entry(ARGV[2], ARGV[3], ARGV[4], ARGV[5]))
return {RECORDED, epoch}
