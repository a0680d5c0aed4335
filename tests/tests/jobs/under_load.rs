//! Reconcile under load: two reconcilers, purchases and units leaking from Redis at once, and no
//! invariant broken.

use crate::env;
use chrono::Utc;
use reconcile::StockCheck;
use seckill_shared::domain::order;
use seckill_shared::infra::db;
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::Refusal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::{commit_order, db_remaining};
use uuid::Uuid;

on_every_redis!(reconcile_during_a_load_of_purchases_breaks_no_invariant,);

/// Takes one unit from Redis stock if there is one: a leak (a unit lost to a crash), injected
/// while purchases run, for reconcile to find. Never drives the stock below zero by itself.
const LEAK: &str = "if tonumber(redis.call('HGET', KEYS[1], 'stock') or '0') > 0 then \
                    return redis.call('HINCRBY', KEYS[1], 'stock', -1) end return -1";

async fn reconcile_during_a_load_of_purchases_breaks_no_invariant(
    kind: RedisKind,
) -> anyhow::Result<()> {
    const STOCK: i64 = 300;
    const WAVES: usize = 8;
    const WAVE: usize = 50;
    let env = Arc::new(env(kind).await?);
    let a = env.open_activity(STOCK, 2).await?;
    let id = a.id;
    let buying = Arc::new(AtomicBool::new(true));
    let done = Arc::new(AtomicBool::new(false));

    // Two reconcilers at once, against each other and the purchases.
    let reconcilers: Vec<_> = (0..2)
        .map(|_| {
            let (job, done) = (env.reconcile(), done.clone());
            tokio::spawn(async move {
                let mut checks = Vec::new();
                while !done.load(Ordering::SeqCst) {
                    let report = job.run(Utc::now()).await?;
                    anyhow::ensure!(report.errors.is_empty(), "{:?}", report.errors);
                    checks.push(report.activity(id).expect("checked").stock_check);
                }
                anyhow::Ok(checks)
            })
        })
        .collect();
    // Redis stock sampled throughout: never below zero.
    let monitor = {
        let (env, done) = (env.clone(), done.clone());
        tokio::spawn(async move {
            let mut samples = 0;
            while !done.load(Ordering::SeqCst) {
                let snap = ledger::snapshot(&env.redis, id).await?;
                let stock = snap.stock.expect("loaded");
                anyhow::ensure!(stock >= 0, "redis stock {stock} < 0");
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            anyhow::Ok(samples)
        })
    };
    // Units leak from Redis while the sale runs; reconcile puts them back from the database.
    // Putting back too many would show up as the database refusing an accepted reservation.
    let leaker = {
        let (env, buying) = (env.clone(), buying.clone());
        let meta_key = env.redis.keys(id).meta;
        tokio::spawn(async move {
            let leak = redis::Script::new(LEAK);
            let mut leaked = 0;
            while buying.load(Ordering::SeqCst) {
                let left: i64 = env
                    .redis
                    .script(leak.prepare_invoke().key(&meta_key))
                    .await?;
                leaked += i64::from(left >= 0);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok(leaked)
        })
    };
    // The consumer: each accepted reservation becomes an order (SQL transaction, then settle),
    // a little later, as if delivered through the queue. `Ok(false)`: the database refused it.
    // A transaction the database ended as transient (a deadlock, say) is tried again, as SQS
    // delivers the message again to the real consumer.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Uuid, i64)>();
    let consumer = {
        let env = env.clone();
        tokio::spawn(async move {
            let mut orders = Vec::new();
            while let Some((user, rid, qty)) = rx.recv().await {
                let env = env.clone();
                orders.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(rand::random_range(0..30))).await;
                    let mut committed = commit_order(&env, id, &user, rid, qty).await;
                    for _ in 0..5 {
                        let transient = committed.as_ref().is_err_and(|e| {
                            e.downcast_ref::<sqlx::Error>()
                                .is_some_and(db::is_transient)
                        });
                        if !transient {
                            break;
                        }
                        committed = commit_order(&env, id, &user, rid, qty).await;
                    }
                    match committed {
                        Ok(_) => {
                            ledger::settle(&env.redis, id, &user, &rid.to_string()).await?;
                            anyhow::Ok(true)
                        }
                        Err(e) if e.to_string() == "DB sold out" => Ok(false),
                        Err(e) => Err(e),
                    }
                }));
            }
            let mut refused = 0;
            for o in orders {
                refused += i64::from(!o.await??);
            }
            anyhow::Ok(refused)
        })
    };
    // Waves of buyers with pauses between them, so the ledger goes quiet now and then and
    // reconcile's stock correction races the next wave.
    let mut reserved = 0;
    for wave in 0..WAVES {
        let buyers: Vec<_> = (0..WAVE)
            .map(|i| {
                let (env, tx) = (env.clone(), tx.clone());
                tokio::spawn(async move {
                    let n = wave * WAVE + i;
                    let (user, qty, rid) = (format!("u{n}"), 1 + (n % 2) as i64, Uuid::new_v4());
                    match testkit::purchase(
                        &env.redis,
                        id,
                        &user,
                        qty,
                        rid,
                        purchase::far_deadline(),
                    )
                    .await?
                    {
                        Ok(Reservation { stock_left, .. }) => {
                            anyhow::ensure!(stock_left >= 0);
                            tx.send((user, rid, qty))?;
                            Ok(qty)
                        }
                        Err(Refusal::SoldOut { .. }) => Ok(0),
                        other => anyhow::bail!("unexpected {other:?}"),
                    }
                })
            })
            .collect();
        for b in buyers {
            reserved += b.await??;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    buying.store(false, Ordering::SeqCst);
    drop(tx);
    let refused = consumer.await??;
    let leaked = leaker.await??;
    // A few more passes over the settled state, then stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, Ordering::SeqCst);
    let mut checks = Vec::new();
    for r in reconcilers {
        checks.extend(r.await??);
    }
    let samples = monitor.await??;
    let corrected = checks
        .iter()
        .filter(|c| matches!(c, StockCheck::Corrected { .. }))
        .count();

    assert!(
        samples > 10 && leaked > 0,
        "{samples} samples, {leaked} leaked"
    );
    assert!(corrected > 0, "no correction ran: {checks:?}");
    assert_eq!(refused, 0, "Redis sold units the database did not have");
    let snap = ledger::snapshot(&env.redis, id).await?;
    let stock = snap.stock.expect("loaded");
    let sold = order::sold_quantity(&env.pool, id).await?;
    assert_eq!(sold, reserved);
    assert!(sold <= STOCK);
    assert!(snap.ledger.is_empty());
    // One last pass puts back whatever leaked last; then every unit is accounted for.
    let report = env.reconcile().run(Utc::now()).await?;
    let r = report.activity(id).unwrap();
    assert!(r.redis_stock >= Some(stock));
    assert_eq!((r.pending_qty, r.drift), (0, 0));
    assert_eq!(r.redis_stock, Some(STOCK - sold));
    assert_eq!(db_remaining(&env, id).await, STOCK - sold);
    Ok(())
}
