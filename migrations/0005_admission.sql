-- Admission: how a sale's buyers are admitted at its opening. `fcfs` (first come, first
-- served) sells to purchases in the order Redis runs them. `draw` collects the purchases of
-- the first `draw_window_ms` after the start into a pool and then draws the winners at random
-- (docs/invariants.md, "Draw admission"); what the draw leaves is sold first come, first
-- served. Both are fixed once the sale has started.
-- `per_user_rate_per_sec`: purchase attempts one user may make per second (0: no limit); the
-- excess is answered 429 by the purchase script.
alter table activities
    add column admission text not null default 'fcfs'
        constraint activities_admission_known check (admission in ('fcfs', 'draw')),
    add column draw_window_ms integer not null default 0
        constraint activities_draw_window_range check (draw_window_ms between 0 and 600000),
    add column per_user_rate_per_sec integer not null default 0
        constraint activities_rate_range check (per_user_rate_per_sec between 0 and 1000),
    add constraint activities_draw_window_named
        check ((admission = 'draw') = (draw_window_ms > 0)),
    add constraint activities_draw_one_bucket check (admission = 'fcfs' or buckets = 1);
