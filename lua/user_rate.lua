-- user_rate.lua: count one request of a user against their rate of database work (the entry's
-- routes that would reach the database; docs/invariants.md, "A user's database rate"). A fixed
-- window: the first request of a window starts it (INCR, then PEXPIRE in the same step, so a
-- counter never lives without an expiry); a refused request is counted too, which never
-- lengthens the window.
--
-- KEYS[1] the user's counter (`<prefix>:dbrate:<userId>`; one key, one slot)
-- ARGV[1] requests allowed per window (an integer >= 1)   ARGV[2] the window, ms
--
-- Returns {code, value}:
local ALLOWED = 0 -- within the rate; value = requests left in this window
local RATE_LIMITED = 1 -- past the rate; value = ms until the window is over (>= 1)
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
local limit = tonumber(ARGV[1])
if n <= limit then return {ALLOWED, limit - n} end
local left = redis.call('PTTL', KEYS[1])
if left < 1 then
  -- A counter with no expiry (never made by this script): give it one, so no user is refused
  -- for good.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  left = tonumber(ARGV[2])
end
return {RATE_LIMITED, left}
