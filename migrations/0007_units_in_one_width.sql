-- Every count of units and every integer setting of a sale in one width, the code's (i64):
-- stock, limits, windows, rates, bucket counts and order quantities become bigint. Rewrites
-- both tables (an ACCESS EXCLUSIVE lock for the length of the rewrite): deploy it between
-- sales. Column grants, checks, indexes and policies carry over unchanged.
alter table activities
    alter column total_stock type bigint,
    alter column remaining_stock type bigint,
    alter column per_order_limit type bigint,
    alter column buckets type bigint,
    alter column draw_window_ms type bigint,
    alter column per_user_rate_per_sec type bigint;

alter table orders
    alter column quantity type bigint;
