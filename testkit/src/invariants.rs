//! The one checker of a sale's books: what docs/invariants.md promises of a sale at a quiet
//! moment, read from Redis and the database with the production readers.
//!
//! - **Conservation**: every unit is in exactly one place: Redis stock (every bucket), a
//!   pending reservation, a transfer between two buckets, or a confirmed or paid order; their
//!   sum is the total stock.
//! - **The database agrees**: its remaining stock is the total less what it sold, and Redis
//!   never offers a unit the database does not hold.
//! - **No oversell**: no bucket's stock below 0, the database's remaining stock not below 0,
//!   what is sold and reserved not above the total.
//! - **The users**: each bucket's `users` holds exactly the users (of that home bucket) with a
//!   live order, a pending reservation or a cancel in flight; the sentinel `""` aside.
//! - **One live order per user.**
//!
//! [`check`] reads a sale and fails naming every broken promise. A test in the middle of an
//! interleaving, where only some of them hold, reads the [`Books`] and asks for the part that
//! does ([`Books::stock_violations`], [`Books::holder_violations`]); a watcher of a running
//! sale checks what holds at every moment ([`Database::never_oversold`],
//! [`stock_never_negative`]); the demo judges the figures it read back with [`Units`].

use crate::env::TestEnv;
use seckill_shared::domain::activity;
use seckill_shared::domain::order;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::{Bucket, SENTINEL};
use seckill_shared::store::ledger::{self, Snapshot};
use seckill_shared::store::values::{EntryKind, LedgerEntry};
use seckill_shared::store::view;
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use uuid::Uuid;

/// One promise of docs/invariants.md about a sale's books.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invariant {
    /// Redis stock + pending + in transfer + sold = total, every bucket loaded.
    Conservation,
    /// The database's remaining stock = total - sold.
    DbRemainingStock,
    /// Redis stock + pending + in transfer <= the database's remaining stock.
    RedisWithinDatabase,
    /// Sold + pending <= total.
    Oversell,
    /// Sold <= total and the remaining stock >= 0, in the database alone (one snapshot).
    DbNeverOversold,
    /// No bucket's stock below 0.
    RedisStockNeverNegative,
    /// `users` = live-order holders + users with a pending reservation or a cancel in flight.
    Participants,
    /// A user's field is in her home bucket's `users`.
    HomeBucket,
    /// At most one confirmed or paid order per user.
    OneLiveOrderPerUser,
}

impl Invariant {
    /// Its name in a finding.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::Conservation => "conservation",
            Invariant::DbRemainingStock => "db_remaining_stock",
            Invariant::RedisWithinDatabase => "redis_within_database",
            Invariant::Oversell => "oversell",
            Invariant::DbNeverOversold => "db_never_oversold",
            Invariant::RedisStockNeverNegative => "redis_stock_never_negative",
            Invariant::Participants => "participants",
            Invariant::HomeBucket => "home_bucket",
            Invariant::OneLiveOrderPerUser => "one_live_order_per_user",
        }
    }
}

/// A broken promise and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant.name(), self.detail)
    }
}

fn broken(invariant: Invariant, detail: String) -> Option<Violation> {
    Some(Violation { invariant, detail })
}

/// Fails with every violation listed (anything that prints: a [`Violation`], or a test's own
/// finding beside them), or passes.
pub fn verdict<V: fmt::Display>(violations: impl IntoIterator<Item = V>) -> anyhow::Result<()> {
    let all: Vec<String> = violations.into_iter().map(|v| v.to_string()).collect();
    anyhow::ensure!(
        all.is_empty(),
        "invariants broken:\n  - {}",
        all.join("\n  - ")
    );
    Ok(())
}

/// Reads sale `activity_id` of the test's env and fails naming every broken promise.
pub async fn check(env: &TestEnv, activity_id: i64) -> anyhow::Result<()> {
    verdict(
        Books::read(&env.redis, &env.pool, activity_id)
            .await?
            .violations(),
    )
}

/// Where a sale's units are: the terms of conservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Units {
    pub total: i64,
    /// Redis stock over every bucket; `None` when a bucket is not loaded.
    pub redis_stock: Option<i64>,
    /// Units of the pending reservations.
    pub pending: i64,
    /// Units taken from one bucket for another, not yet known to be there.
    pub in_transfer: i64,
    /// Confirmed and paid units.
    pub sold: i64,
    /// The database's remaining stock.
    pub db_remaining: i64,
}

impl Units {
    /// The units found: Redis stock (0 when missing) + pending + in transfer + sold.
    pub fn accounted(&self) -> i64 {
        self.redis_stock.unwrap_or(0) + self.pending + self.in_transfer + self.sold
    }

    /// Every unit in exactly one place, the sale loaded in Redis.
    pub fn conservation(&self) -> Option<Violation> {
        let Units {
            total,
            pending,
            in_transfer,
            sold,
            ..
        } = *self;
        match self.redis_stock {
            None => broken(
                Invariant::Conservation,
                format!(
                    "the sale is not loaded in Redis (pending {pending}, in transfer \
                     {in_transfer}, sold {sold}, total {total})"
                ),
            ),
            Some(stock) if self.accounted() != total => broken(
                Invariant::Conservation,
                format!(
                    "redis stock {stock} + pending {pending} + in transfer {in_transfer} + sold \
                     {sold} = {} but the total stock is {total}",
                    self.accounted()
                ),
            ),
            Some(_) => None,
        }
    }

    /// The database's remaining stock is the total less what it sold.
    pub fn database_agrees(&self) -> Option<Violation> {
        let Units {
            total,
            sold,
            db_remaining,
            ..
        } = *self;
        (db_remaining != total - sold).then(|| Violation {
            invariant: Invariant::DbRemainingStock,
            detail: format!(
                "remaining stock {db_remaining} but total {total} - sold {sold} = {}",
                total - sold
            ),
        })
    }

    /// Redis offers no unit the database does not hold: its stock, with what is reserved or
    /// on its way between buckets, fits in the database's remaining stock.
    pub fn redis_within_database(&self) -> Option<Violation> {
        let stock = self.redis_stock?;
        let offered = stock + self.pending + self.in_transfer;
        (offered > self.db_remaining).then(|| Violation {
            invariant: Invariant::RedisWithinDatabase,
            detail: format!(
                "redis offers {stock} units + pending {} + in transfer {}, the database has {}",
                self.pending, self.in_transfer, self.db_remaining
            ),
        })
    }

    /// No more units sold and reserved than the sale has.
    pub fn oversell(&self) -> Option<Violation> {
        let Units {
            total,
            pending,
            sold,
            ..
        } = *self;
        (pending + sold > total).then(|| Violation {
            invariant: Invariant::Oversell,
            detail: format!("pending {pending} + sold {sold} > total {total}"),
        })
    }
}

/// The database's side of a sale, read in one snapshot (a repeatable-read transaction): an
/// admin's change of the total and the orders are seen at the same moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Database {
    pub total: i64,
    pub remaining: i64,
    /// Confirmed and paid units.
    pub sold: i64,
    /// The sale's bucket count.
    pub buckets: u32,
    /// Each live (confirmed or paid) order's user and request id.
    pub live_holders: Vec<(String, Uuid)>,
}

impl Database {
    pub async fn read(pool: &PgPool, activity_id: i64) -> anyhow::Result<Self> {
        let mut tx = pool
            .begin_with("begin isolation level repeatable read read only")
            .await?;
        let a = activity::get(&mut *tx, activity_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("sale {activity_id} is gone from the database"))?;
        let sold = order::sold_quantity(&mut *tx, activity_id).await?;
        let live_holders = order::live_holders(&mut *tx, activity_id).await?;
        tx.commit().await?;
        Ok(Self {
            total: a.total_stock,
            remaining: a.remaining_stock,
            sold,
            buckets: a.bucket_count(),
            live_holders,
        })
    }

    /// What holds at every moment, in the database alone: sold <= total, remaining >= 0.
    pub fn never_oversold(&self) -> Option<Violation> {
        let Database {
            total,
            remaining,
            sold,
            ..
        } = *self;
        (sold > total || remaining < 0).then(|| Violation {
            invariant: Invariant::DbNeverOversold,
            detail: format!("sold {sold}, total stock {total}, remaining stock {remaining}"),
        })
    }
}

/// A bucket's stock is never below 0 (`stock` as Redis holds it; `None`: not loaded).
pub fn stock_never_negative(bucket: Bucket, stock: Option<i64>) -> Option<Violation> {
    let stock = stock.filter(|s| *s < 0)?;
    broken(
        Invariant::RedisStockNeverNegative,
        format!("Redis stock of bucket {} is {stock}", bucket.index),
    )
}

/// One bucket's Redis state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketBooks {
    pub bucket: Bucket,
    /// The stock as Redis holds it, a value below 0 kept (the snapshot reports one as
    /// missing); `None` when the bucket is not loaded.
    pub stock: Option<i64>,
    /// The bucket's snapshot, every ledger entry read.
    pub snapshot: Snapshot,
    /// The users its `users` holds, the sentinel aside.
    pub users: BTreeSet<String>,
}

impl BucketBooks {
    async fn read(redis: &Redis, bucket: Bucket) -> anyhow::Result<Self> {
        let snapshot = ledger::snapshot(redis, bucket).await?;
        let stock = view::stock(redis, bucket).await?;
        let k = redis.bucket_keys(bucket);
        let users: Vec<String> = redis.cmd(redis::cmd("HKEYS").arg(&k.users)).await?;
        Ok(Self {
            bucket,
            stock: stock.filter(|_| snapshot.loaded),
            snapshot,
            users: users.into_iter().filter(|u| u != SENTINEL).collect(),
        })
    }
}

/// A sale's books: the database's side in one snapshot, then every bucket's Redis state.
/// Read at a quiet moment, they are consistent; read while actors run, only the checks of one
/// side at a time are ([`Database::never_oversold`], [`stock_never_negative`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Books {
    pub activity_id: i64,
    pub database: Database,
    /// Bucket 0 first.
    pub buckets: Vec<BucketBooks>,
}

impl Books {
    pub async fn read(redis: &Redis, pool: &PgPool, activity_id: i64) -> anyhow::Result<Self> {
        let database = Database::read(pool, activity_id).await?;
        let mut buckets = Vec::new();
        for bucket in Bucket::all(activity_id, database.buckets) {
            buckets.push(BucketBooks::read(redis, bucket).await?);
        }
        Ok(Self {
            activity_id,
            database,
            buckets,
        })
    }

    /// Every ledger entry of every bucket.
    pub fn ledger(&self) -> impl Iterator<Item = &LedgerEntry> {
        self.buckets.iter().flat_map(|b| b.snapshot.ledger.iter())
    }

    /// The terms of conservation.
    pub fn units(&self) -> Units {
        let stocks: Option<Vec<i64>> = self.buckets.iter().map(|b| b.stock).collect();
        Units {
            total: self.database.total,
            redis_stock: stocks.map(|s| s.iter().sum()),
            pending: self
                .buckets
                .iter()
                .map(|b| b.snapshot.pending_quantity())
                .sum(),
            in_transfer: self
                .buckets
                .iter()
                .map(|b| b.snapshot.transfer_quantity())
                .sum(),
            sold: self.database.sold,
            db_remaining: self.database.remaining,
        }
    }

    /// Every promise broken.
    pub fn violations(&self) -> Vec<Violation> {
        let mut all = self.stock_violations();
        all.extend(self.holder_violations());
        all
    }

    /// The units' promises: conservation, the database agreeing, no oversell.
    pub fn stock_violations(&self) -> Vec<Violation> {
        let units = self.units();
        let mut all: Vec<Violation> = [
            units.conservation(),
            units.database_agrees(),
            units.redis_within_database(),
            units.oversell(),
            self.database.never_oversold(),
        ]
        .into_iter()
        .flatten()
        .collect();
        all.extend(
            self.buckets
                .iter()
                .filter_map(|b| stock_never_negative(b.bucket, b.stock)),
        );
        all
    }

    /// The holders' promises: the users of each bucket, one live order per user.
    pub fn holder_violations(&self) -> Vec<Violation> {
        let mut all: Vec<Violation> = self.home_bucket().into_iter().collect();
        all.extend(self.participants());
        all.extend(self.one_live_order_per_user());
        all
    }

    /// Every user in `users` sits in her home bucket.
    fn home_bucket(&self) -> Vec<Violation> {
        self.buckets
            .iter()
            .flat_map(|b| {
                b.users
                    .iter()
                    .filter(|u| Bucket::home(self.activity_id, b.bucket.count, u) != b.bucket)
                    .map(|u| Violation {
                        invariant: Invariant::HomeBucket,
                        detail: format!("user {u} is in the users of bucket {}", b.bucket.index),
                    })
            })
            .collect()
    }

    /// `users` holds exactly the users with a live order, a pending reservation or a cancel in
    /// flight.
    fn participants(&self) -> Option<Violation> {
        let members: BTreeSet<&str> = self
            .buckets
            .iter()
            .flat_map(|b| b.users.iter().map(String::as_str))
            .collect();
        let mut holders: BTreeSet<&str> = self
            .database
            .live_holders
            .iter()
            .map(|(user, _)| user.as_str())
            .collect();
        holders.extend(
            self.ledger()
                .filter(|e| matches!(e.kind, EntryKind::Reservation | EntryKind::Cancel))
                .map(|e| e.user_id.as_str()),
        );
        if members == holders {
            return None;
        }
        let extra: Vec<&&str> = members.difference(&holders).collect();
        let missing: Vec<&&str> = holders.difference(&members).collect();
        broken(
            Invariant::Participants,
            format!(
                "{} user(s) in Redis's users holding nothing: {}; {} holder(s) missing from it: \
                 {}",
                extra.len(),
                some(&extra),
                missing.len(),
                some(&missing)
            ),
        )
    }

    fn one_live_order_per_user(&self) -> Option<Violation> {
        let mut live: BTreeMap<&str, Vec<Uuid>> = BTreeMap::new();
        for (user, request_id) in &self.database.live_holders {
            live.entry(user).or_default().push(*request_id);
        }
        let doubles: Vec<(&str, Vec<Uuid>)> =
            live.into_iter().filter(|(_, ids)| ids.len() > 1).collect();
        if doubles.is_empty() {
            return None;
        }
        broken(
            Invariant::OneLiveOrderPerUser,
            format!(
                "{} user(s) with more than one live order (by request id): {}",
                doubles.len(),
                some(&doubles)
            ),
        )
    }
}

/// A few items of a list, for a violation's message.
pub fn some<T: fmt::Debug>(items: &[T]) -> String {
    const SHOWN: usize = 5;
    if items.len() <= SHOWN {
        format!("{items:?}")
    } else {
        format!("{:?} and {} more", &items[..SHOWN], items.len() - SHOWN)
    }
}
