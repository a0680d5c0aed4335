//! The payment timeout: an unpaid order past it is released, and every sale is released while one
//! cannot release its orders.

use crate::{env, PAYMENT_TIMEOUT};
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::domain::order;
use seckill_shared::domain::status::OrderStatus;
use std::time::Duration;
use testkit::on_both_redis;
use testkit::RedisKind;
use testkit::{consume, db_remaining, is_participant, redis_stock, reserve};

on_both_redis!(
    unpaid_order_past_the_payment_timeout_is_released,
    the_payment_timeout_releases_every_sale_while_one_cannot_release_its_orders,
);

async fn unpaid_order_past_the_payment_timeout_is_released(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let rid = reserve(&env, a.id, "alice", 2).await.attempt.request_id;
    let order_id = consume(&env, a.id, "alice", rid, 2).await?;
    let paid_rid = reserve(&env, a.id, "bob", 1).await.attempt.request_id;
    let paid = consume(&env, a.id, "bob", paid_rid, 1).await?;
    testkit::pay(&env.pool, paid, env.config.payment_timeout)
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
