-- draw_settle.lua: the drawer's Redis half of a draw's record and of each chunk of its
-- winners' orders (docs/invariants.md, "Draw admission", steps 3 and 4).
--
-- With ARGV[1] (the load epoch of the draw whose outcome the caller committed to the
-- database) the meta is marked `recorded`, only in a meta that is there, whose draw is done,
-- under that epoch (a sale loaded from scratch since holds another draw, or was loaded drawn
-- from the record). Then the reservations of the winners whose orders the caller committed
-- are dropped (each only while it is that request's), and with ARGV[2] = '1' the meta is
-- marked `written`: every winner has its order row, so reconcile may judge the sale's
-- reservations by their age again.
--
-- KEYS[1] meta   KEYS[2] ledger
-- ARGV[1] the recorded draw's load epoch ('' = none)   ARGV[2] '1' = every order is written
-- ARGV[3..] user, requestId, for each winner whose order committed
--
-- Returns {recorded (1: the meta says so), written (1: the meta says so), dropped}:
local state = redis.call('HMGET', KEYS[1], 'drawn', 'recorded', 'epoch', 'written')
if ARGV[1] ~= '' and state[1] == '1' and state[3] == ARGV[1] and state[2] ~= '1' then
  redis.call('HSET', KEYS[1], 'recorded', '1')
  state[2] = '1'
end
local dropped = 0
for i = 3, #ARGV - 1, 2 do
  local user, request_id = ARGV[i], ARGV[i + 1]
  local _, id = entry_fields(redis.call('HGET', KEYS[2], user) or '')
  if id == request_id then
    redis.call('HDEL', KEYS[2], user)
    dropped = dropped + 1
  end
end
if ARGV[2] == '1' and state[1] == '1' and state[4] ~= '1' then
  redis.call('HSET', KEYS[1], 'written', '1')
  state[4] = '1'
end
return {state[2] == '1' and 1 or 0, state[4] == '1' and 1 or 0, dropped}
