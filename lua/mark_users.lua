-- mark_users.lua: the first step of reconcile's orphan check (docs/invariants.md,
-- "Reconcile", step 3): each candidate gets a mark (an `x` entry) in the ledger before the
-- database is read, so whatever the user does meanwhile replaces or removes it, and
-- drop_user.lua removes only users whose mark is still there. Only users with a field and no
-- entry are marked, never the sentinel "".
--
-- KEYS[1] users   KEYS[2] ledger
-- ARGV[1] token   ARGV[2] now (ms)   ARGV[3..] user ids
--
-- Returns the users marked.
local marked = {}
for i = 3, #ARGV do
  local u = ARGV[i]
  if u ~= '' and redis.call('HEXISTS', KEYS[1], u) == 1
      and redis.call('HEXISTS', KEYS[2], u) == 0 then
    redis.call('HSET', KEYS[2], u, check_mark(ARGV[1], ARGV[2]))
    marked[#marked + 1] = u
  end
end
return marked
