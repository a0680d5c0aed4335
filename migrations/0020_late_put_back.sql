-- A user's kept draw entry goes back into the pool when her later entry, answered 503, left it
-- in its place: the entry puts it back at once, and the drawer, before each draw step, for
-- every 503 its clean-up handles (the entry's own put-back may not have got through). Put back
-- once the draw had begun, it is late, and whoever put it back marks it so
-- (docs/invariants.md, "Draw admission", "What the database keeps").
grant update (late) on draw_entries to seckill_entry, seckill_reconcile;
