//! The payment timeout: an unpaid order past it is released, every sale is released while one
//! cannot release its orders, and orders behind stale cancel entries are released without a
//! run passing its deadline.

use crate::{env, PAYMENT_TIMEOUT};
use chrono::{Duration as ChronoDuration, Utc};
use futures::StreamExt;
use seckill_shared::domain::order;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::protocol::cancel;
use std::time::{Duration, Instant};
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::{consume, db_remaining, is_participant, redis_stock, reserve, snapshot};
use testkit::{dead_pool, invariants};

on_every_redis!(
    unpaid_order_past_the_payment_timeout_is_released,
    the_payment_timeout_releases_every_sale_while_one_cannot_release_its_orders,
    unpaid_orders_behind_stale_cancel_entries_are_released_each_run_within_its_deadline,
);

async fn unpaid_order_past_the_payment_timeout_is_released(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    let order_id = consume(&env, a.id, "alice", rid, 2).await?;
    let paid_rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    let paid = consume(&env, a.id, "bob", paid_rid, 1).await?;
    testkit::pay(&env, paid, env.config.payment_timeout)
        .await?
        .map_err(anyhow::Error::msg)?;
    let job = env.reconcile();

    let before = job.run(Utc::now()).await?;
    assert_eq!(before.released_unpaid, 0);

    let past_timeout = Utc::now()
        + ChronoDuration::from_std(PAYMENT_TIMEOUT).unwrap()
        + ChronoDuration::seconds(1);
    let report = job.run(past_timeout).await?;

    assert_eq!(report.released_unpaid, 1);
    assert_eq!(report.activity(a.id).unwrap().released_unpaid, 1);
    assert_eq!(
        order::get(&env.pool, order_id).await?.unwrap().status,
        OrderStatus::Cancelled
    );
    assert_eq!(
        order::get(&env.pool, paid).await?.unwrap().status,
        OrderStatus::Paid
    );
    assert_eq!(db_remaining(&env, a.id).await, 9);
    assert_eq!(redis_stock(&env, a.id).await, Some(9));
    assert!(!is_participant(&env, a.id, "alice").await);
    let r = report.activity(a.id).unwrap();
    assert_eq!((r.sold, r.pending_qty, r.drift), (1, 0, 0));
    // The user may buy again.
    reserve(&env, a.id, "alice", 1).await;
    Ok(())
}

/// Sale A runs but Redis lost it, so none of its unpaid orders can be released until it is
/// loaded again (a cancel answers `busy`); there are more of them than one run releases, and
/// they are older than sale B's. The payment timeout still releases B's order within a lap,
/// and leaves A's as they are.
async fn the_payment_timeout_releases_every_sale_while_one_cannot_release_its_orders(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let mut env = env(kind).await?;
    env.config.release_batch = 3;
    // Well before the sales' end (in an hour): a cancel of an ended sale changes the database
    // alone, and sale A must stay one that runs.
    env.config.payment_timeout = Duration::from_secs(60);
    let a = env.open_activity(10, 5).await?;
    let b = env.open_activity(10, 5).await?;
    let mut stuck = Vec::new();
    for i in 0..4 {
        let user = format!("a{i}");
        let rid = reserve(&env, a.id, &user, 1).await.attempt.request_id;
        stuck.push(consume(&env, a.id, &user, rid, 1).await?);
    }
    let rid = reserve(&env, b.id, "bob", 1).await.attempt.request_id;
    let bobs = consume(&env, b.id, "bob", rid, 1).await?;
    testkit::lose_activity(&env.redis, a.id).await?;
    let job = env.reconcile();
    let past_timeout = Utc::now() + ChronoDuration::seconds(61);

    let status = |id: i64| {
        let pool = env.pool.clone();
        async move { order::get(&pool, id).await.map(|o| o.unwrap().status) }
    };
    let mut runs = 0;
    while status(bobs).await? == OrderStatus::Confirmed && runs < 4 {
        let mut report = reconcile::ReconcileReport::default();
        job.release_unpaid(past_timeout, &mut report).await;
        assert!(report.errors.is_empty(), "{report:?}");
        runs += 1;
    }

    assert_eq!(
        status(bobs).await?,
        OrderStatus::Cancelled,
        "sale B's unpaid order is still confirmed after {runs} runs"
    );
    assert_eq!(db_remaining(&env, b.id).await, 10);
    assert_eq!(redis_stock(&env, b.id).await, Some(10));
    for id in stuck {
        assert_eq!(
            status(id).await?,
            OrderStatus::Confirmed,
            "sale A is not loaded"
        );
    }
    assert_eq!(db_remaining(&env, a.id).await, 6);
    Ok(())
}

/// 300 unpaid orders past the payment timeout whose buyers each left a cancel attempt behind:
/// announced in the ledger, then its commit lost with the database (the cancel run on a
/// database out of reach: a `c` entry and no commit), as one blip during a release batch
/// leaves them. With a run budget of 1 s, every run ends within the deadline it was given
/// (the release waits for none of them, where it waited 2 s for each, and stops when its share
/// is spent), and over the next runs every order is released: the stale entry the release
/// meets is repaired (aborted in the database, dropped) and its order released in the same
/// lap. Every unit is back, once.
async fn unpaid_orders_behind_stale_cancel_entries_are_released_each_run_within_its_deadline(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const ORDERS: usize = 300;
    const BUDGET: Duration = Duration::from_secs(1);
    let env = env(kind).await?;
    let a = env.open_activity(ORDERS as i64, 1).await?;
    let mut orders = Vec::new();
    for i in 0..ORDERS {
        let user = format!("u{i:03}");
        let rid = reserve(&env, a.id, &user, 1).await.attempt.request_id;
        let id = consume(&env, a.id, &user, rid, 1).await?;
        orders.push(order::get(&env.pool, id).await?.expect("the order"));
    }
    let dead = dead_pool();
    let failed: Vec<bool> = futures::stream::iter(&orders)
        .map(|o| {
            let (dead, redis) = (&dead, &env.redis);
            async move {
                cancel::cancel_order(dead, redis, o, Utc::now())
                    .await
                    .is_err()
            }
        })
        .buffer_unordered(100)
        .collect()
        .await;
    assert!(failed.iter().all(|f| *f), "each attempt lost its commit");
    assert_eq!(
        snapshot(&env, a.id).await.ledger_size,
        ORDERS as i64,
        "a `c` entry each"
    );

    let job = env.reconcile_with(|c| c.config.reconcile_budget = BUDGET);
    let past_timeout = Utc::now()
        + ChronoDuration::from_std(PAYMENT_TIMEOUT).unwrap()
        + ChronoDuration::seconds(1);
    let status = |id: i64| {
        let pool = env.pool.clone();
        async move { order::get(&pool, id).await.map(|o| o.unwrap().status) }
    };
    let mut runs = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        let deadline = started + BUDGET;
        let run = job.run_by(past_timeout, deadline);
        let report = tokio::time::timeout(BUDGET * 10, run).await.map_err(|_| {
            anyhow::anyhow!("run {} went on 10 times past its deadline", runs.len())
        })??;
        let took = started.elapsed();
        assert!(
            crate::within_deadline(took, BUDGET),
            "run {} took {took:?}: {report:?}",
            runs.len()
        );
        assert!(report.errors.is_empty(), "{report:?}");
        runs.push((took, report.released_unpaid, report.release_repaired));
        let mut left = 0;
        for o in &orders {
            left += usize::from(status(o.id).await? == OrderStatus::Confirmed);
        }
        if left == 0 {
            break;
        }
    }
    for o in &orders {
        assert_eq!(status(o.id).await?, OrderStatus::Cancelled, "{runs:?}");
    }
    assert_eq!(snapshot(&env, a.id).await.ledger_size, 0, "{runs:?}");
    assert_eq!(db_remaining(&env, a.id).await, ORDERS as i64);
    assert_eq!(redis_stock(&env, a.id).await, Some(ORDERS as i64));
    invariants::check(&env, a.id).await?;
    Ok(())
}
