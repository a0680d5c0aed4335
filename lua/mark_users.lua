-- mark_users.lua: the first step of reconcile's orphan check.
--
-- A user in `users` with no ledger entry and no live order in the database holds nothing and
-- is removed (drop_user.lua). Between reading the database and removing, the user may cancel,
-- leave, buy again and settle: `users` and the ledger would look the same as before.
-- So each candidate first gets a mark in the ledger, "x|<token>|0|<ms>", before the database
-- is read; whatever the user does meanwhile replaces or removes the mark (a cancel begins by
-- overwriting it), and drop_user.lua removes only users whose mark is still there.
-- Only users with a field are marked (a ledger entry never stands without one), and never the
-- sentinel field "".
--
-- KEYS[1] users   KEYS[2] ledger
-- ARGV[1] token   ARGV[2] now (ms)   ARGV[3..] user ids
--
-- Returns the users marked (users with a field and no entry); the others are left alone.
local marked = {}
for i = 3, #ARGV do
  local u = ARGV[i]
  if u ~= '' and redis.call('HEXISTS', KEYS[1], u) == 1
      and redis.call('HEXISTS', KEYS[2], u) == 0 then
    redis.call('HSET', KEYS[2], u, 'x|' .. ARGV[1] .. '|0|' .. ARGV[2])
    marked[#marked + 1] = u
  end
end
return marked
