-- combined_check_and_set.lua: stock and one order per user checked and set in one script
-- (GET, SISMEMBER, DECR, SADD; "把库存与限购合成一个 Lua 脚本"), for the benchmark's
-- side-by-side script rows only (the product's scripts are in lua/).
--
-- KEYS[1] stock key (string integer)
-- KEYS[2] user set of the activity
-- ARGV[1] user id
--
-- Returns 1 bought; 0 no stock left; 2 the user already bought; -1 stock not loaded.
local userId = ARGV[1]
local stock = redis.call('GET', KEYS[1])
if stock == false then return -1 end
if tonumber(stock) <= 0 then return 0 end
if redis.call('SISMEMBER', KEYS[2], userId) == 1 then return 2 end
redis.call('DECR', KEYS[1])
redis.call('SADD', KEYS[2], userId)
return 1
