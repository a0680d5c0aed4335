-- give_back.lua: give a reservation's or a committed cancel's units back, at most once
-- (docs/invariants.md, "The rule: one arbiter per unit" and "Cancel", step 3). Only while the
-- ledger holds this very entry (kind and id), which it removes in the same step: a retry, a
-- redelivery or a concurrent repair gives the units back once. A reservation is given back by
-- whoever holds the database's claim on it (a `failed` row), a cancel for the cancel id the
-- order row recorded.
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger   (one hash tag)
-- ARGV[1] user id   ARGV[2] the entry's id (request id, or cancel id)
-- ARGV[3] the entry's kind: "r" a reservation, "c" a cancel attempt
-- ARGV[4] "full" = stock back and the user out of `users` (the purchase never happened, or the
--         order is cancelled), "stock" = stock back only (the user keeps an order they hold)
--
-- Returns {code, qty}:
local NOT_THERE = 0 -- no such entry (already given back or settled, or never this one's)
local GIVEN_BACK = 1 -- qty units are back in the stock
local v = redis.call('HGET', KEYS[3], ARGV[1])
if not v then return {NOT_THERE, 0} end
local kind, id, qty = entry_fields(v)
if kind ~= ARGV[3] or id ~= ARGV[2] then return {NOT_THERE, 0} end
if redis.call('EXISTS', KEYS[1]) == 1 then
  add_stock(KEYS[1], qty)
end
if ARGV[4] == 'full' then redis.call('HDEL', KEYS[2], ARGV[1]) end
redis.call('HDEL', KEYS[3], ARGV[1])
return {GIVEN_BACK, tonumber(qty)}
