-- prelude.lua: the one writer and reader of each value format the scripts keep in Redis, and
-- the clock they read; docs/invariants.md, "The state", tells the formats, and
-- shared/src/store/values.rs reads them back on the Rust side. It is no script of its own:
-- the loader (shared/src/store/scripts.rs) puts before each script the functions of this file
-- that the script calls (and those they call), so a script pays only for what it uses, and
-- scripts/redis_acl.py counts the commands of exactly those. So every function here is a
-- `local function` (a script defines no global) that starts at the line's start and ends
-- with an `end` alone on a line, calls a prelude function only from above it, touches only
-- keys its caller passes in (from KEYS), and answers values, never a reply code.

-- The server's clock, in ms (TIME: the one clock every script and the window agree on).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A ledger entry: units reserved, the order message on its way.
local function reservation(request_id, qty, ms)
  return 'r|' .. request_id .. '|' .. qty .. '|' .. ms
end

-- A ledger entry: a cancel attempt between Redis and the database.
local function cancel_entry(cancel_id, qty, ms, order_id)
  return 'c|' .. cancel_id .. '|' .. qty .. '|' .. ms .. '|' .. order_id
end

-- A ledger entry: a check (reconcile's orphan check, a restore of a lost field) is looking at
-- the user; it holds no units.
local function check_mark(token, ms)
  return 'x|' .. token .. '|0|' .. ms
end

-- A ledger entry (under a transfer's field): units taken from this bucket for a buyer whose
-- home bucket is `home`, in load epoch `epoch`.
local function transfer_entry(transfer_id, qty, ms, home, epoch)
  return 't|' .. transfer_id .. '|' .. qty .. '|' .. ms .. '|' .. home .. '|' .. epoch
end

-- A ledger entry's kind (`r`, `c`, `x` or `t`), the id that guards it and its units (a
-- string); nothing when the value is no entry.
local function entry_fields(value)
  return string.match(value, '^(%a)|([^|]+)|(%d+)|')
end

-- A pool entry; `state` is `q` (queued; after the draw, not drawn), `w` (won) or `x` (a
-- tombstone: the entry was taken back after a 503).
local function pool_entry(request_id, qty, rank, state)
  return request_id .. '|' .. qty .. '|' .. rank .. '|' .. state
end

-- A pool entry's request id, units, rank (strings) and state; nothing when the value is no
-- entry (the sentinel).
local function pool_fields(value)
  return string.match(value, '^([^|]+)|(%d+)|(%d+)|(%a)$')
end

-- The draw's count of the queued entries its cursor has not passed, by units asked (`q:<units>`
-- in the meta), and `fitMin`, at most the fewest units any of them asks: once the stock left
-- is below it nothing left can win, and the draw is done without walking the rest
-- (draw.lua). A count may be high (an entry taken back after the draw began keeps its
-- count), never low; a meta without `fitCounts` (loaded by a build that did not count) walks.
-- `fit_min`: the meta's `fitMin` when the caller read it already (false when it has none).
local function count_entry(meta, qty, fit_min)
  redis.call('HINCRBY', meta, 'q:' .. qty, 1)
  if fit_min == nil then fit_min = redis.call('HGET', meta, 'fitMin') end
  local low = tonumber(fit_min or '')
  if not low or tonumber(qty) < low then redis.call('HSET', meta, 'fitMin', qty) end
end

local function uncount_entry(meta, qty)
  redis.call('HINCRBY', meta, 'q:' .. qty, -1)
end

-- A draw winner (under its request id, in the sale's `winners` until the database records the
-- outcome): the winner, its units and the load epoch the draw ran under.
local function winner_entry(user, qty, epoch)
  return user .. '|' .. qty .. '|' .. epoch
end

-- A sale's terms as one value (`terms` in the meta, written in the same HSET as the fields it
-- is made of): the config version they were written under, then the window, per-order limit,
-- draw end and per-user rate, each as written. purchase.lua takes a caller's copy of it in
-- place of reading those fields, and only when the copy is this very string and the meta's
-- `version` is still the one it names (a writer that does not know `terms` moves the version).
local function sale_terms(version, start_ms, end_ms, limit, draw_end_ms, rate)
  return version .. ':' .. start_ms .. ':' .. end_ms .. ':' .. limit .. ':' .. draw_end_ms
    .. ':' .. rate
end

-- The terms a loaded meta's own fields make (the draw end and the rate absent: 0).
local function terms_of_fields(meta)
  local t = redis.call('HMGET', meta, 'version', 'startMs', 'endMs', 'limit', 'drawEndMs',
    'rate')
  return sale_terms(t[1], t[2], t[3], t[4], t[5] or '0', t[6] or '0')
end

-- Writes the meta's stock as `stock`, moving the stock sequence on from `seq`, in one HSET
-- (more field-value pairs may ride along); answers the new sequence. Every move of the stock
-- moves the sequence.
local function put_stock(meta, stock, seq, ...)
  redis.call('HSET', meta, 'stock', stock, 'seq', seq + 1, ...)
  return seq + 1
end

-- Adds `units` to the meta's stock and moves the stock sequence on (HINCRBY each); answers
-- the new stock.
local function add_stock(meta, units)
  local stock = redis.call('HINCRBY', meta, 'stock', units)
  redis.call('HINCRBY', meta, 'seq', 1)
  return stock
end

-- A draw entrant's ticket: the first 52 bits (13 hex digits, exact as a score) of
-- HMAC-SHA1(the sale's secret, user id), from the two padded keys the load wrote in the meta
-- (`drawKeyI`, `drawKeyO`). The same user always gets the same ticket.
local function ticket_of(key_i, key_o, user)
  local inner = (string.gsub(redis.sha1hex(key_i .. user), '%x%x',
    function(h) return string.char(tonumber(h, 16)) end))
  return tonumber(string.sub(redis.sha1hex(key_o .. inner), 1, 13), 16)
end
