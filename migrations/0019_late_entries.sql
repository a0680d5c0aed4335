-- A draw entry put back into its pool only once the draw had begun (Redis lost the sale while
-- its message was on the queue, and the draw could not wait for it any longer): the draw
-- could not look at it, and its buyer reads `entered_late`. The consumer marks it so when it
-- puts it back, and a later rebuild of the pool puts it back late again
-- (docs/invariants.md, "Draw admission", "What the database keeps").
alter table draw_entries add column late boolean not null default false;

grant update (late) on draw_entries to seckill_consumer;
