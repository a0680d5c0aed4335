-- pool_restore.lua: put a draw sale's entries back into its pool from the database, after a
-- load from scratch (the loader's chunks, from the meta's cursor `restoreAt`) or after the
-- consumer wrote an entry whose Redis half may have been lost (docs/invariants.md, "Draw
-- admission", "What the database keeps"). Only into a sale that is loaded, under the load
-- epoch the caller read (the loader's), or any (the consumer's).
--
-- An entry (`q`, or `l` for one the database keeps as late) goes in only when the user has no
-- field in the pool: a live entry, a winner and the entry's own tombstone (it was taken back
-- after a 503) all stay as they are; the tombstone of another request of the user is no
-- entry. It gets the next arrival rank. The loader's entries get their ticket (HMAC-SHA1 of
-- the sale's secret and the user id, as purchase.lua makes it). The consumer's entry gets its
-- ticket while the pool is open (no draw step ran, no outcome known); otherwise a ticket below
-- the cursor would shift every index after it, and the draw could not look at the entry: it
-- is **late** (`l`, counted in the meta's `lateEntries`, its request id answered so that the
-- database keeps it late), unless the draw's final cutoff (the draw done, or its recorded
-- outcome known to the rebuild) is below its ticket: then it is an ordinary loser (`q`,
-- `not_drawn`). A winner (`w`, restored from the recorded outcome) gets back what the draw
-- gave it: the field in `users`, its reservation in the ledger (stamped now) and its entry in
-- `winners`; the load took its units from the stock already.
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   KEYS[4] pool   KEYS[5] winners   KEYS[6] tickets
-- ARGV[1] the load epoch the caller read ('' = any)
-- ARGV[2] 'q' entries, 'l' entries the database keeps as late, 'w' winners
-- ARGV[3] '' the consumer's; 'cleanup' the drawer's put-back of a 503's kept entry, as the
--         consumer's but nothing while a rebuild is under way (the loader puts the entry back,
--         knowing from the database whether the draw looked at it); else the loader's: its
--         cursor after this chunk, 'recorded' (the
--         rebuild of a sale whose outcome is recorded begins: the cutoff ARGV[4] is the
--         draw's, final, from now on), or 'done' (the rebuild is whole, only while it is
--         under way: the cursor goes, and with ARGV[4] the draw is marked done and recorded;
--         'done-wait' = the same, and without ARGV[4] the draw waits (`waitEntries`) until the
--         drawer finds the entries sent before the window closed written, or its wait bound
--         passed)
-- ARGV[4] the recorded outcome's cutoff ('' = none)
-- ARGV[5..] user, requestId, qty, for each entry
--
-- Returns {code, restored, late request ids...}: for the consumer and the clean-up, an entry
-- already held late is answered late again, so that a mark the database lost is made again.
local NOT_LOADED = 0
local RESTORED = 1
local STALE = 2 -- another load's epoch: nothing written
local meta = redis.call('HMGET', KEYS[1], 'epoch', 'drawKeyI', 'drawKeyO', 'drawAt', 'drawn',
  'restoreAt', 'drawCutoff', 'recorded')
if not meta[1] then return {NOT_LOADED, 0, {}} end
if ARGV[1] ~= '' and ARGV[1] ~= meta[1] then return {STALE, 0, {}} end
-- The pool and tickets are made with the meta (and their sentinels): never made here.
if redis.call('EXISTS', KEYS[4]) == 0 then return {NOT_LOADED, 0, {}} end
local now = now_ms()
local loader = ARGV[3] ~= '' and ARGV[3] ~= 'cleanup'
-- The clean-up during a rebuild writes nothing (below, each entry only answered late again).
local hold_only = ARGV[3] == 'cleanup' and meta[6]
if ARGV[3] == 'recorded' and meta[6] then
  redis.call('HSET', KEYS[1], 'drawCutoff', ARGV[4], 'recorded', '1')
  meta[7], meta[8] = ARGV[4], '1'
end
local final = meta[5] == '1' or meta[8] == '1'
local open = not meta[4] and not final
local late = {}
local function add_ticket(user)
  if not meta[2] or not meta[3] then return end
  redis.call('ZADD', KEYS[6], 'NX', ticket_of(meta[2], meta[3], user), user)
end
local restored = 0
for i = 5, #ARGV - 2, 3 do
  local user, request_id, qty = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local rank = nil
  if ARGV[2] == 'w' then
    rank = redis.call('HINCRBY', KEYS[1], 'poolSize', 1)
    redis.call('HSET', KEYS[4], user, pool_entry(request_id, qty, rank, 'w'))
    redis.call('HSET', KEYS[2], user, request_id)
    redis.call('HSET', KEYS[3], user, reservation(request_id, qty, now))
    redis.call('HSET', KEYS[5], request_id, winner_entry(user, qty, meta[1]))
    -- Its draw is recorded and never runs again: the ticket shifts no cursor.
    add_ticket(user)
    restored = restored + 1
  else
    local held = redis.call('HGET', KEYS[4], user)
    -- A tombstone of another request (a 503 the user entered again after) is no entry.
    local held_id, _, _, state = pool_fields(held or '')
    if state == 'x' and held_id ~= request_id then held = nil end
    if held and not loader and state == 'l' and held_id == request_id then
      late[#late + 1] = request_id
    end
    if not held and not hold_only then
      rank = redis.call('HINCRBY', KEYS[1], 'poolSize', 1)
      local state = ARGV[2]
      if state == 'q' and (open or loader) then
        add_ticket(user)
        count_entry(KEYS[1], qty)
      elseif state == 'q' and not (final and meta[2] and meta[3] and meta[7]
          and ticket_of(meta[2], meta[3], user) > tonumber(meta[7])) then
        state = 'l'
        late[#late + 1] = request_id
      end
      if state == 'l' then redis.call('HINCRBY', KEYS[1], 'lateEntries', 1) end
      redis.call('HSET', KEYS[4], user, pool_entry(request_id, qty, rank, state))
      restored = restored + 1
    end
  end
end
if (ARGV[3] == 'done' or ARGV[3] == 'done-wait') and meta[6] then
  redis.call('HDEL', KEYS[1], 'restoreAt')
  if ARGV[4] ~= '' then
    redis.call('HSET', KEYS[1], 'drawn', '1', 'recorded', '1', 'drawCutoff', ARGV[4])
  elseif ARGV[3] == 'done-wait' then
    redis.call('HSET', KEYS[1], 'waitEntries', '1')
  end
elseif tonumber(ARGV[3]) and meta[6] and tonumber(ARGV[3]) > tonumber(meta[6]) then
  redis.call('HSET', KEYS[1], 'restoreAt', ARGV[3])
end
return {RESTORED, restored, late}
