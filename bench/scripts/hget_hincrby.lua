-- hget_hincrby.lua: atomic deduction on a goods hash ("Lua 脚本原子扣减": HGET + HINCRBY):
-- read the stock field of the goods hash, take the units when enough are left. No user set, no ledger. For the benchmark's side-by-side script rows only.
--
-- KEYS[1] goods hash
-- ARGV[1] stock field name
-- ARGV[2] units to buy
--
-- Returns 1 bought; 0 not enough stock.
local stock = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
local buyNum = tonumber(ARGV[2])
if stock >= buyNum then
  redis.call('HINCRBY', KEYS[1], ARGV[1], -buyNum)
  return 1
end
return 0
