-- mark_lost.lua: the first step of a restore of lost fields (docs/invariants.md, "Lost
-- fields"): each holder of a live order, as the database listed them, whose field in `users`
-- does not name that order's request gets a mark (an `x` entry) in the ledger before the
-- database is read again; restore_user.lua writes the field only while the mark is still
-- there. Whatever the user does meanwhile replaces the mark first (a purchase writes its
-- reservation over it, a cancel its own mark), and a load from scratch empties the ledger.
-- A user with an entry in flight is left alone: the field is that entry's. Another check's
-- mark is taken over only in mode "take" (a cancel that needs the field now).
--
-- KEYS[1] meta   KEYS[2] users   KEYS[3] ledger
-- ARGV[1] token   ARGV[2] now (ms)   ARGV[3] "take" or "wait"
-- ARGV[4..] pairs: user id, the request id of the user's live order
--
-- Returns a flat list, for each user marked: the user id, then what the user's field held
-- ("" when it was absent). Nothing while the sale is not loaded.
local marked = {}
if redis.call('EXISTS', KEYS[1]) == 0 then return marked end
for i = 4, #ARGV - 1, 2 do
  local u = ARGV[i]
  local held = u ~= '' and redis.call('HGET', KEYS[2], u)
  if u ~= '' and held ~= ARGV[i + 1] then
    local v = redis.call('HGET', KEYS[3], u)
    if not v or (ARGV[3] == 'take' and entry_fields(v) == 'x') then
      redis.call('HSET', KEYS[3], u, check_mark(ARGV[1], ARGV[2]))
      marked[#marked + 1] = u
      marked[#marked + 1] = held or ''
    end
  end
end
return marked
