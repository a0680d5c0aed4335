-- A draw's recorded winners become their orders in chunks, written by the drawer (reconcile)
-- from `draw_winners` in request id order: each chunk inserts its winners' orders, takes their
-- units from the sale's stock once and moves the cursor below, in one transaction. A crash
-- between two chunks resumes at the cursor; `written_at` says every winner has its order row
-- (docs/invariants.md, "Draw admission").
alter table draw_outcomes
    add column written_after uuid,
    add column written_at timestamptz;

-- The chunks' order: a page of a sale's winners after the cursor is one index range.
create index draw_winners_in_order on draw_winners (activity_id, request_id);
drop index draw_winners_by_sale;

grant update (written_after, written_at) on draw_outcomes to seckill_reconcile;
