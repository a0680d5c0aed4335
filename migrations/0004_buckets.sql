-- Stock buckets: a sale's Redis stock split over `buckets` hash tags, so a cluster spreads one
-- hot sale over its shards (docs/invariants.md, "Bucketed sales"). 1 is the layout every sale
-- had before. The count is fixed once the sale has started or has an order: a user's home
-- bucket, which holds their quota, is a function of it.
alter table activities
    add column buckets integer not null default 1
    constraint activities_buckets_range check (buckets between 1 and 16);
