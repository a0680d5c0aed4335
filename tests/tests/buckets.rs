//! Bucketed sales on the 3-master Redis Cluster: a sale's stock split over buckets on
//! different shards, with one order per user and no undersell (docs/invariants.md,
//! "Bucketed sales"). Crowds with demand far over the stock, skewed users, a crash between
//! the two steps of a borrow, a cancel and a re-buy across buckets, admin changes of a
//! bucketed sale, and the interleavings that would break a naive version.

use chrono::Utc;
use futures::StreamExt;
use order_consumer::Outcome;
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::infra::pause;
use seckill_shared::protocol;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::protocol::purchase::Outcome as Decided;
use seckill_shared::store;
use seckill_shared::store::buckets;
use seckill_shared::store::keys;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::keys::Home;
use seckill_shared::store::ledger::EntryKind;
use seckill_shared::store::meta;
use seckill_shared::store::view;
use seckill_shared::ApiError;
use seckill_shared::Refusal;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use testkit::after_grace;
use testkit::invariants;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

const CLUSTER: RedisKind = RedisKind::Cluster;

/// One purchase attempt as the entry makes it (the Redis decision), and the order message it
/// would send.
async fn attempt(
    env: &TestEnv,
    a: &Activity,
    user: &str,
    quantity: i64,
    known: u32,
) -> anyhow::Result<Result<OrderMessage, Refusal>> {
    attempt_with(
        env,
        &protocol::purchase::Hints::none(),
        a,
        user,
        quantity,
        known,
    )
    .await
}

/// [`attempt`] with a container's hints.
async fn attempt_with(
    env: &TestEnv,
    hints: &protocol::purchase::Hints,
    a: &Activity,
    user: &str,
    quantity: i64,
    known: u32,
) -> anyhow::Result<Result<OrderMessage, Refusal>> {
    let mut buy = Attempt {
        request_id: Uuid::now_v7(),
        activity_id: a.id,
        user_id: user.to_string(),
        quantity,
        buckets: known,
    };
    let deadline = store::purchase::far_deadline();
    Ok(
        match protocol::purchase::enter(&env.redis, hints, &mut buy, deadline).await? {
            Decided::Reserved(r) => Ok(OrderMessage {
                attempt: Attempt {
                    buckets: r.buckets,
                    ..buy
                },
                reserved_at_ms: r.now_ms,
                load_epoch: Some(r.epoch),
                kind: MessageKind::Order,
            }),
            Decided::Refused(refusal) => Err(refusal),
            other => anyhow::bail!("a first-come sale answered {other:?}"),
        },
    )
}

/// Every user of `users` tries `tries` times, 64 attempts at a time; half the attempts come
/// with no knowledge of the bucket count (a fresh container). Returns the accepted messages
/// and every refusal.
async fn crowd(
    env: &TestEnv,
    a: &Activity,
    users: &[String],
    tries: usize,
) -> (Vec<OrderMessage>, Vec<Refusal>) {
    let attempts: Vec<(usize, &String)> = (0..tries)
        .flat_map(|t| users.iter().map(move |u| (t, u)))
        .collect();
    let results: Vec<Result<OrderMessage, Refusal>> = futures::stream::iter(attempts)
        .map(|(t, user)| async move {
            let known = if t % 2 == 0 { a.bucket_count() } else { 1 };
            attempt(env, a, user, 1, known)
                .await
                .expect("redis answers")
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for r in results {
        match r {
            Ok(m) => accepted.push(m),
            Err(refusal) => refused.push(refusal),
        }
    }
    (accepted, refused)
}

/// The consumer commits every message, 16 at a time.
async fn commit_all(env: &TestEnv, messages: &[OrderMessage]) {
    let consumer = env.consumer();
    let outcomes: Vec<Outcome> = futures::stream::iter(messages)
        .map(|m| {
            let consumer = &consumer;
            async move { consumer.handle_message(m).await.expect("consumed").outcome }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Committed),
        "{outcomes:?}"
    );
}

/// Redis stock of every bucket, bucket 0 first.
async fn stocks(env: &TestEnv, a: &Activity) -> Vec<i64> {
    buckets::stocks(&env.redis, a.id, a.bucket_count())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.expect("every bucket loaded"))
        .collect()
}

/// Whether the user holds a field in their home bucket's `users`.
async fn in_users(env: &TestEnv, a: &Activity, user: &str) -> bool {
    let home = Bucket::home(a.id, a.bucket_count(), user);
    env.redis
        .cmd(
            redis::cmd("HEXISTS")
                .arg(env.redis.bucket_keys(home).users)
                .arg(user),
        )
        .await
        .unwrap()
}

/// Users whose home bucket (of `count`) is `index`.
fn users_at_home(activity_id: i64, count: u32, index: u32, n: usize, tag: &str) -> Vec<String> {
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .filter(|u| Bucket::home(activity_id, count, u).index == index)
        .take(n)
        .collect()
}

fn distinct_users(messages: &[OrderMessage]) -> usize {
    messages
        .iter()
        .map(|m| m.attempt.user_id.as_str())
        .collect::<HashSet<_>>()
        .len()
}

async fn sells_exactly_the_stock_to_a_crowd_ten_times_over(count: u32) -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(150, 1, count).await?;
    let users: Vec<String> = (0..1500).map(|i| format!("crowd-{i}")).collect();
    // Every user twice: one order per user must hold though they spread over the buckets.
    let (accepted, refused) = crowd(&env, &a, &users, 2).await;
    assert_eq!(accepted.len(), 150, "exactly the stock is accepted");
    assert_eq!(distinct_users(&accepted), 150, "no user twice");
    assert!(
        refused
            .iter()
            .all(|r| matches!(r, Refusal::SoldOut { .. } | Refusal::AlreadyPurchased)),
        "{refused:?}"
    );
    commit_all(&env, &accepted).await;
    assert_eq!(stocks(&env, &a).await, vec![0; count as usize], "0 left");
    assert_eq!(order::sold_quantity(&env.pool, a.id).await?, 150);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_buckets_sell_exactly_the_stock_to_a_crowd_ten_times_over() -> anyhow::Result<()> {
    sells_exactly_the_stock_to_a_crowd_ten_times_over(3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_buckets_sell_exactly_the_stock_to_a_crowd_ten_times_over() -> anyhow::Result<()> {
    sells_exactly_the_stock_to_a_crowd_ten_times_over(8).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skewed_buyers_empty_their_home_bucket_early_and_still_buy_every_unit() -> anyhow::Result<()>
{
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(90, 1, 3).await?;
    // 900 buyers, 720 of them at home in bucket 0, which holds a third of the stock.
    let mut users = users_at_home(a.id, 3, 0, 720, "hot");
    users.extend(users_at_home(a.id, 3, 1, 90, "warm"));
    users.extend(users_at_home(a.id, 3, 2, 90, "cool"));
    let (accepted, _) = crowd(&env, &a, &users, 1).await;
    assert_eq!(accepted.len(), 90);
    assert_eq!(distinct_users(&accepted), 90);
    let hot = accepted
        .iter()
        .filter(|m| m.attempt.user_id.starts_with("hot"))
        .count();
    assert!(
        hot > 30,
        "bucket 0's buyers borrowed the others' units: {hot} of 90"
    );
    commit_all(&env, &accepted).await;
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    // Only bucket 0's buyers are left, all its units are gone: the next one is sold out.
    let late = users_at_home(a.id, 3, 0, 1, "late")[0].clone();
    let refused = attempt(&env, &a, &late, 1, 3).await?;
    assert!(
        matches!(refused, Err(Refusal::SoldOut { .. })),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_last_unit_anywhere_is_found_by_a_buyer_of_any_bucket() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(3, 2, 3).await?;
    // Sell bucket 0 and 1 dry with their own buyers, leave one unit in bucket 2.
    for (index, tag) in [(0, "zero"), (1, "one")] {
        let user = users_at_home(a.id, 3, index, 1, tag)[0].clone();
        let m = attempt(&env, &a, &user, 1, 3).await?.expect("accepted");
        commit_all(&env, &[m]).await;
    }
    let mut left = stocks(&env, &a).await;
    left.sort();
    assert_eq!(left.iter().sum::<i64>(), 1);
    // A buyer at home where nothing is left asks for 2: one unit is all there is.
    let empty = stocks(&env, &a).await.iter().position(|s| *s == 0).unwrap() as u32;
    let user = users_at_home(a.id, 3, empty, 1, "two")[0].clone();
    let refused = attempt(&env, &a, &user, 2, 3).await?;
    assert_eq!(refused.unwrap_err(), Refusal::SoldOut { stock_left: 1 });
    // Asked for 1, the same buyer gets the last unit, wherever it was.
    let m = attempt(&env, &a, &user, 1, 3)
        .await?
        .expect("the last unit");
    commit_all(&env, &[m]).await;
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// The home bucket of a fresh buyer whose bucket is empty, and that buyer: the bucket
/// whose stock is `empty_index` is emptied by its own buyers first.
async fn empty_home(env: &TestEnv, a: &Activity, index: u32) -> anyhow::Result<String> {
    let share = stocks(env, a).await[index as usize];
    let buyers = users_at_home(a.id, a.bucket_count(), index, share as usize, "drain");
    let mut messages = Vec::new();
    for u in &buyers {
        messages.push(
            attempt(env, a, u, 1, a.bucket_count())
                .await?
                .expect("own stock"),
        );
    }
    commit_all(env, &messages).await;
    assert_eq!(stocks(env, a).await[index as usize], 0);
    Ok(users_at_home(a.id, a.bucket_count(), index, 1, "borrower")[0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_between_the_two_steps_of_a_borrow_is_repaired_by_reconcile() -> anyhow::Result<()>
{
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(9, 1, 3).await?;
    let user = empty_home(&env, &a, 0).await?;
    let before: i64 = stocks(&env, &a).await.iter().sum();

    // The entry takes units from a donor, then dies before its home bucket holds them.
    let _crash = pause::arm_failure("purchase.after_borrow", a.id, 1);
    let crashed = attempt(&env, &a, &user, 1, 3).await;
    assert!(crashed.is_err(), "the purchase never happened: {crashed:?}");
    let snaps = buckets::snapshots(&env.redis, a.id, 3).await?;
    let moving: Vec<_> = snaps
        .iter()
        .flat_map(|(_, s)| s.ledger.iter())
        .filter(|e| e.kind == EntryKind::Transfer)
        .collect();
    assert_eq!(moving.len(), 1, "the units wait in the donor's ledger");
    let taken = moving[0].quantity;
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), before - taken);
    invariants::check(&env, a.id).await?;
    assert!(!in_users(&env, &a, &user).await, "the user holds nothing");

    // Within the grace period reconcile leaves the transfer alone (the buyer may be slow)...
    let report = env.reconcile().run(Utc::now()).await?;
    assert_eq!(report.activity(a.id).unwrap().transfers_finished, 0);
    // ...after it, the units are put where the buyer was taking them, once.
    let report = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    assert_eq!(report.activity(a.id).unwrap().transfers_finished, 1);
    assert_eq!(report.activity(a.id).unwrap().drift, 0);
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), before);
    assert!(stocks(&env, &a).await[0] >= 1, "in the home bucket");
    invariants::check(&env, a.id).await?;
    let again = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    assert_eq!(again.activity(a.id).unwrap().transfers_finished, 0);

    // The buyer, who was told 503, buys again and gets a unit; the sale sells out exactly.
    let m = attempt(&env, &a, &user, 1, 3).await?.expect("bought");
    commit_all(&env, &[m]).await;
    let rest: Vec<String> = (0..40).map(|i| format!("rest-{i}")).collect();
    let (accepted, _) = crowd(&env, &a, &rest, 1).await;
    commit_all(&env, &accepted).await;
    assert_eq!(order::sold_quantity(&env.pool, a.id).await?, 9);
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_borrower_and_reconcile_finishing_its_transfer_credit_the_units_once(
) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(CLUSTER).await?);
    let a = env.open_sale_in_buckets(9, 1, 3).await?;
    let user = empty_home(&env, &a, 1).await?;
    let total_left: i64 = stocks(&env, &a).await.iter().sum();

    // The buyer stops between the borrow and its purchase in the home bucket...
    let paused = pause::arm("purchase.after_borrow", a.id);
    let buyer = {
        let (env, a, user) = (env.clone(), a.clone(), user.clone());
        tokio::spawn(async move { attempt(&env, &a, &user, 1, 3).await })
    };
    paused.reached().await;
    // ...while reconcile, past the grace period, finishes the transfer it left.
    let report = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    assert_eq!(report.activity(a.id).unwrap().transfers_finished, 1);
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), total_left);
    // The buyer goes on with the same transfer as its credit: the home bucket has it already.
    paused.resume();
    let m = buyer.await??.expect("bought with the borrowed unit");
    assert_eq!(
        stocks(&env, &a).await.iter().sum::<i64>(),
        total_left - 1,
        "the borrowed units counted once"
    );
    commit_all(&env, &[m]).await;
    invariants::check(&env, a.id).await?;
    let report = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    assert_eq!(report.activity(a.id).unwrap().drift, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_and_a_re_buy_cross_buckets() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(6, 1, 3).await?;
    // The buyer's home is empty: their unit is borrowed from another bucket.
    let user = empty_home(&env, &a, 2).await?;
    let m = attempt(&env, &a, &user, 1, 3).await?.expect("bought");
    commit_all(&env, std::slice::from_ref(&m)).await;
    let row = order::by_request(&env.pool, m.attempt.request_id)
        .await?
        .unwrap();
    assert_eq!(row.home().index, 2);
    invariants::check(&env, a.id).await?;
    let before = stocks(&env, &a).await;

    // The cancel gives the unit and the quota back in the buyer's home bucket.
    let cancelled = cancel::cancel_order(&env.pool, &env.redis, &row, Utc::now()).await?;
    assert_eq!(cancelled, CancelOutcome::Cancelled { quantity: 1 });
    let after = stocks(&env, &a).await;
    assert_eq!(after[2], before[2] + 1);
    invariants::check(&env, a.id).await?;

    // The same user buys again (their quota is back), and a buyer of another bucket takes
    // the unit that came back when their own bucket is empty too.
    let again = attempt(&env, &a, &user, 1, 3).await?.expect("re-bought");
    commit_all(&env, &[again]).await;
    let twice = attempt(&env, &a, &user, 1, 3).await?;
    assert_eq!(twice.unwrap_err(), Refusal::AlreadyPurchased);
    let rest: Vec<String> = (0..30).map(|i| format!("other-{i}")).collect();
    let (accepted, _) = crowd(&env, &a, &rest, 1).await;
    commit_all(&env, &accepted).await;
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    assert_eq!(order::sold_quantity(&env.pool, a.id).await?, 6);
    invariants::check(&env, a.id).await?;
    // Reconcile's payment timeout releases the unpaid orders of a bucketed sale, each in its
    // buyer's home bucket.
    let past_timeout = Utc::now()
        + chrono::Duration::from_std(env.config.payment_timeout)?
        + chrono::Duration::seconds(1);
    assert!(in_users(&env, &a, &user).await);
    let report = env.reconcile().run(past_timeout).await?;
    assert_eq!(report.activity(a.id).unwrap().released_unpaid, 6);
    assert_eq!(report.activity(a.id).unwrap().drift, 0);
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), 6);
    assert_eq!(order::sold_quantity(&env.pool, a.id).await?, 0);
    let unpaid = order::latest_for_user(&env.pool, a.id, &user)
        .await?
        .unwrap();
    assert_eq!(unpaid.status, "cancelled");
    assert!(!in_users(&env, &a, &user).await);
    invariants::check(&env, a.id).await?;
    Ok(())
}

fn patch_total(total: i64) -> ActivityPatch {
    ActivityPatch {
        total_stock: Some(total),
        ..ActivityPatch::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_lower_of_a_mostly_sold_bucketed_sale_takes_from_the_buckets_that_hold_units(
) -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let admin = env.admin_state();
    let a = env.open_sale_in_buckets(30, 1, 3).await?;
    // 25 of 30 sold, the 5 left unevenly: all of bucket 0's units went.
    let mut messages = Vec::new();
    for u in users_at_home(a.id, 3, 0, 10, "zero") {
        messages.push(attempt(&env, &a, &u, 1, 3).await?.expect("sold"));
    }
    for u in users_at_home(a.id, 3, 1, 8, "one")
        .into_iter()
        .chain(users_at_home(a.id, 3, 2, 7, "two"))
    {
        messages.push(attempt(&env, &a, &u, 1, 3).await?.expect("sold"));
    }
    commit_all(&env, &messages).await;
    assert_eq!(stocks(&env, &a).await, vec![0, 2, 3]);

    // More than is left (with a new limit besides): refused whole, nothing changed anywhere,
    // the limit neither.
    let too_much = ActivityPatch {
        per_order_limit: Some(5),
        ..patch_total(24)
    };
    let refused = admin::update_activity(&admin, a.id, &too_much).await;
    assert!(matches!(refused, Err(ApiError::Conflict(_))), "{refused:?}");
    assert_eq!(stocks(&env, &a).await, vec![0, 2, 3]);
    for b in Bucket::all(a.id, 3) {
        let limit: Option<i64> = env
            .redis
            .cmd(
                redis::cmd("HGET")
                    .arg(env.redis.bucket_keys(b).meta)
                    .arg("limit"),
            )
            .await?;
        assert_eq!(limit, Some(1), "bucket {}", b.index);
    }
    assert_eq!(
        activity::get(&env.pool, a.id).await?.unwrap().total_stock,
        30
    );
    invariants::check(&env, a.id).await?;

    // Lowering by 4 takes 4 of the 5 units left, from the buckets that hold them.
    let lowered = admin::update_activity(&admin, a.id, &patch_total(26)).await?;
    assert_eq!((lowered.total_stock, lowered.remaining_stock), (26, 1));
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), 1);
    invariants::check(&env, a.id).await?;
    // A raise spreads over the buckets; the crowd then buys exactly what there is.
    let raised = admin::update_activity(&admin, a.id, &patch_total(32)).await?;
    assert_eq!(raised.remaining_stock, 7);
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), 7);
    let rest: Vec<String> = (0..70).map(|i| format!("late-{i}")).collect();
    let (accepted, _) = crowd(&env, &a, &rest, 1).await;
    assert_eq!(accepted.len(), 7);
    commit_all(&env, &accepted).await;
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    assert_eq!(order::sold_quantity(&env.pool, a.id).await?, 32);
    invariants::check(&env, a.id).await?;
    // The admin's stats add the buckets up.
    let detail = admin::activity_detail(&admin, a.id).await?;
    assert_eq!(detail.stats.redis_stock, Some(0));
    assert_eq!(detail.stats.bucket_stock, vec![Some(0); 3]);
    assert_eq!(detail.stats.participants, 32);
    assert_eq!(detail.stats.drift, Some(0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bucket_count_changes_only_before_the_start_and_reloads_the_layout(
) -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let admin = env.admin_state();
    let start = Utc::now() + chrono::Duration::minutes(5);
    let a = env
        .sale_in_buckets(12, 1, start, start + chrono::Duration::hours(1), 3)
        .await?;
    assert_eq!(stocks(&env, &a).await, vec![4, 4, 4]);
    let patch = ActivityPatch {
        buckets: Some(4),
        ..ActivityPatch::default()
    };
    let changed = admin::update_activity(&admin, a.id, &patch).await?;
    assert_eq!(changed.buckets, 4);
    assert_eq!(stocks(&env, &changed).await, vec![3, 3, 3, 3]);
    // The three-bucket layout is gone: none of its buckets but bucket 0 (shared) is loaded.
    for b in Bucket::all(a.id, 3).skip(1) {
        assert_eq!(
            view::stock(&env.redis, b).await?,
            None,
            "bucket {}",
            b.index
        );
    }
    // A container that still knows three buckets finds the new layout through bucket 0.
    let user = (0..)
        .map(|i| format!("stale-{i}"))
        .find(|u| Bucket::home(a.id, 3, u).index != 0)
        .unwrap();
    let early = attempt(&env, &changed, &user, 1, 3).await?;
    assert_eq!(early.unwrap_err(), Refusal::NotStarted);
    // A lower before the sale is loaded again changes the database (and the next load).
    let lowered = admin::update_activity(&admin, a.id, &patch_total(10)).await?;
    assert_eq!(lowered.remaining_stock, 10);
    let bad = ActivityPatch {
        buckets: Some(17),
        ..ActivityPatch::default()
    };
    let refused = admin::update_activity(&admin, a.id, &bad).await;
    assert!(
        matches!(refused, Err(ApiError::BadRequest(_))),
        "{refused:?}"
    );

    // Once the sale runs, the count is fixed.
    let running = env.open_sale_in_buckets(12, 1, 3).await?;
    let refused = admin::update_activity(&admin, running.id, &patch).await;
    assert!(matches!(refused, Err(ApiError::Conflict(_))), "{refused:?}");
    assert_eq!(
        activity::get(&env.pool, running.id).await?.unwrap().buckets,
        3
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_public_view_adds_up_the_buckets_and_a_lost_bucket_reloads_the_whole_sale(
) -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(10, 2, 3).await?;
    let view = view::view(&env.redis, a.id).await?.expect("loaded");
    assert_eq!(view.stock, 10);
    let m = attempt(&env, &a, "viewer", 2, 1).await?.expect("bought");
    commit_all(&env, &[m]).await;
    assert_eq!(view::view(&env.redis, a.id).await?.unwrap().stock, 8);

    // A shard restarted empty: one bucket is gone. The sale is not loaded as a whole any
    // more, and reconcile loads it from scratch from the database, with a new epoch.
    let lost = Bucket::all(a.id, 3).nth(1).unwrap();
    let k = env.redis.bucket_keys(lost);
    env.redis
        .cmd::<i64>(redis::cmd("DEL").arg(&k.meta).arg(&k.users).arg(&k.ledger))
        .await?;
    assert_eq!(view::view(&env.redis, a.id).await?, None);
    let report = env.reconcile().run(Utc::now()).await?;
    assert!(report.activity(a.id).unwrap().preheated);
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), 8);
    let reloaded = activity::get(&env.pool, a.id).await?.unwrap();
    assert_eq!(reloaded.load_epoch, a.load_epoch + 1);
    // The buyer is still known: no second order.
    let again = attempt(&env, &a, "viewer", 1, 3).await?;
    assert_eq!(again.unwrap_err(), Refusal::AlreadyPurchased);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stock_fix_does_not_count_a_cancel_that_lands_between_its_reads_in_another_bucket(
) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(CLUSTER).await?);
    let a = env.open_sale_in_buckets(9, 1, 3).await?;
    let user = users_at_home(a.id, 3, 2, 1, "canceller")[0].clone();
    let m = attempt(&env, &a, &user, 1, 3).await?.expect("bought");
    commit_all(&env, std::slice::from_ref(&m)).await;
    // Redis lost two units in bucket 0 (a lower whose commit outcome was unknown, say): the
    // stock fix must put them back, and only them.
    let k0 = env.redis.bucket_keys(Bucket::all(a.id, 3).next().unwrap());
    env.redis
        .cmd::<i64>(redis::cmd("HINCRBY").arg(&k0.meta).arg("stock").arg(-2))
        .await?;
    // Reconcile reads every bucket, then stops before it reads the database...
    let paused = pause::arm("reconcile.stock.after_snapshot", a.id);
    let job = {
        let env = env.clone();
        tokio::spawn(async move { env.reconcile().run(Utc::now()).await })
    };
    paused.reached().await;
    // ...while the buyer cancels, all three steps, in bucket 2: the database gains the unit
    // before reconcile reads it, and Redis gains it in a bucket reconcile already read.
    let row = order::by_request(&env.pool, m.attempt.request_id)
        .await?
        .unwrap();
    let cancelled = cancel::cancel_order(&env.pool, &env.redis, &row, Utc::now()).await?;
    assert_eq!(cancelled, CancelOutcome::Cancelled { quantity: 1 });
    paused.resume();
    let report = job.await??;
    let check = &report.activity(a.id).unwrap().stock_check;
    assert_eq!(
        *check,
        reconcile::StockCheck::Moved,
        "the fix waits for a quiet read"
    );
    // The next run fixes exactly the two lost units.
    let report = env.reconcile().run(Utc::now()).await?;
    assert!(matches!(
        report.activity(a.id).unwrap().stock_check,
        reconcile::StockCheck::Corrected {
            from: Some(7),
            to: 9
        }
    ));
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), 9);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_whose_lease_ran_out_cannot_write_a_bucket_the_next_holder_stamped(
) -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(9, 1, 3).await?;
    let ttl = Duration::from_millis(300);
    let mut stale =
        seckill_shared::protocol::lock::acquire(&env.redis, &env.pool, a.id, ttl, ttl).await?;
    stale.stop_watchdog();
    tokio::time::sleep(ttl * 2).await;
    let next =
        seckill_shared::protocol::lock::acquire(&env.redis, &env.pool, a.id, ttl * 10, ttl).await?;
    let bucket = Bucket::all(a.id, 3).nth(2).unwrap();
    let meta = meta::SaleMeta {
        title: a.title.clone(),
        total: 9,
        per_order_limit: 1,
        start_at: a.start_at,
        end_at: a.end_at,
        version: a.config_version + 1,
        expire_at: a.expire_at(env.config.expiry_buffer),
        draw_end_ms: 0,
        rate: 0,
        price_minor: a.price_minor,
        currency: a.currency.clone(),
        max_entrants: a.max_entrants,
    };
    let refused = meta::adjust(&env.redis, bucket, &stale.owner, -3, &meta, "stale").await?;
    assert_eq!(refused, meta::Adjust::NotOwner);
    assert!(!buckets::unload(&env.redis, bucket, &stale.owner).await?);
    assert_eq!(stocks(&env, &a).await, vec![3, 3, 3]);
    let applied = meta::adjust(&env.redis, bucket, &next.owner, -1, &meta, "next").await?;
    assert_eq!(applied, meta::Adjust::Applied);
    next.release().await?;
    // Released: the stamps are gone with the lock.
    let stamp = env.redis.bucket_keys(bucket).lock;
    let exists: i64 = env.redis.cmd(redis::cmd("EXISTS").arg(&stamp)).await?;
    assert_eq!(exists, 0);
    assert!(keys::transfer_field(Uuid::nil()).starts_with(' '));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_borrow_delivered_twice_takes_once_and_answers_what_it_took() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(12, 1, 3).await?;
    let mut all = Bucket::all(a.id, 3);
    let (home, donor) = (all.next().unwrap(), all.next().unwrap());
    let id = Uuid::new_v4();
    let first = store::purchase::borrow(&env.redis, donor, home, id, 1)
        .await?
        .expect("taken");
    let again = store::purchase::borrow(&env.redis, donor, home, id, 1)
        .await?
        .expect("answered");
    assert_eq!((first.units, again.units), (2, 2), "half of 4, once");
    assert_eq!(stocks(&env, &a).await, vec![4, 2, 4]);
    invariants::check(&env, a.id).await?;
    // Finished twice (the buyer's background retry and reconcile, say): credited once.
    protocol::purchase::finish_by_id(&env.redis, donor, home, id).await?;
    protocol::purchase::finish_by_id(&env.redis, donor, home, id).await?;
    assert_eq!(stocks(&env, &a).await, vec![6, 2, 4]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_entry_sells_a_bucketed_sale_over_http_and_each_buyer_finds_their_order(
) -> anyhow::Result<()> {
    use axum::http::StatusCode;
    use testkit::call;
    use testkit::request;
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(4, 1, 3).await?;
    let app = env.entry_router();
    let path = format!("/activities/{}/orders", a.id);
    let buyers: Vec<String> = (0..3)
        .flat_map(|i| users_at_home(a.id, 3, i, 2, &format!("http{i}")))
        .collect();
    let mut accepted = Vec::new();
    for user in &buyers {
        let (status, body) = call(&app, request("POST", &path, Some((user, "")), None)).await;
        match status {
            StatusCode::ACCEPTED => accepted.push(user.clone()),
            StatusCode::CONFLICT => assert_eq!(body["error"], "sold_out", "{body}"),
            other => panic!("{other} {body}"),
        }
        if status == StatusCode::ACCEPTED {
            // The buyer's order, from the ledger of their home bucket, wherever that is.
            let me = format!("/activities/{}/orders/me", a.id);
            let (_, mine) = call(&app, request("GET", &me, Some((user, "")), None)).await;
            assert_eq!(mine["status"], "pending", "{user}: {mine}");
        }
    }
    assert_eq!(accepted.len(), 4, "every unit, whichever buckets held them");
    let sent: Vec<OrderMessage> = env
        .drain_messages(10)
        .await?
        .iter()
        .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
        .collect();
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|m| m.attempt.buckets == 3), "{sent:?}");
    commit_all(&env, &sent).await;
    for user in &accepted {
        let me = format!("/activities/{}/orders/me", a.id);
        let (_, mine) = call(&app, request("GET", &me, Some((user, "")), None)).await;
        assert_eq!(mine["status"], "confirmed", "{user}: {mine}");
    }
    let view = format!("/activities/{}", a.id);
    let (status, public) = call(&app, request("GET", &view, None, None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(public["remainingStock"], 0, "{public}");
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A sold-out sale of three buckets, then 300 refusals by one container (its hints): each
/// costs about one script call, the home bucket's purchase. The first short buyers ask the
/// donors and one sale-wide check finds every bucket empty; the buyers after them are told
/// `sold_out` on that check for its quarter second, and the donors a borrow found empty are
/// skipped for a second. Without hints every refusal asks both donors: three calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_of_a_sold_out_bucketed_sale_costs_about_one_script_call() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(3, 1, 3).await?;
    for i in 0..3 {
        let user = &users_at_home(a.id, 3, i, 1, "first")[0];
        assert!(attempt(&env, &a, user, 1, 3).await?.is_ok());
    }
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);

    let hints = protocol::purchase::Hints::new();
    let home = pause::count("purchase.home", a.id);
    let borrows = pause::count("purchase.borrow", a.id);
    let users: Vec<String> = (0..300).map(|i| format!("late-{i}")).collect();
    let refused: Vec<Refusal> = futures::stream::iter(&users)
        .map(|u| {
            let (env, a, hints) = (&env, &a, &hints);
            async move {
                attempt_with(env, hints, a, u, 1, 3)
                    .await
                    .unwrap()
                    .unwrap_err()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(refused.iter().all(|r| matches!(r, Refusal::SoldOut { .. })));
    let calls = f64::from(home.hits() + borrows.hits()) / users.len() as f64;
    assert!(
        calls <= 1.2,
        "{calls:.2} script calls per refusal ({} home, {} borrows)",
        home.hits(),
        borrows.hits()
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A short buyer asks both donors, finds nothing, and pauses before its sale-wide check; a
/// reservation in a donor is given back meanwhile. The check finds the unit and the buyer
/// borrows it: no `sold_out` while a unit is in stock somewhere (asking the donors one after
/// another alone told this buyer `sold_out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unit_given_back_to_a_donor_already_asked_is_found_by_the_sale_wide_check(
) -> anyhow::Result<()> {
    let env = std::sync::Arc::new(TestEnv::new(CLUSTER).await?);
    let a = env.open_sale_in_buckets(3, 1, 3).await?;
    let mut held = Vec::new();
    for i in 0..3 {
        let user = &users_at_home(a.id, 3, i, 1, "first")[0];
        held.push(attempt(&env, &a, user, 1, 3).await?.unwrap());
    }
    let buyer = users_at_home(a.id, 3, 0, 1, "short")[0].clone();
    let paused = pause::arm("purchase.before_check", a.id);
    let short = {
        let (env, a) = (env.clone(), a.clone());
        tokio::spawn(async move { attempt(&env, &a, &buyer, 1, 3).await.unwrap() })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    // The buyer at home in bucket 1 gives her unit back (a 503's give-back, say).
    let m = &held[1];
    let units = store::ledger::compensate(
        &env.redis,
        m.home(),
        &m.attempt.user_id,
        m.attempt.request_id,
        store::ledger::Compensation::Full,
    )
    .await?;
    assert_eq!(units, Some(1));
    paused.resume();
    let bought = short.await?;
    assert!(bought.is_ok(), "the unit given back was found: {bought:?}");
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    Ok(())
}

/// A crowd through the entry's router on the cluster, 128 at a time: 1,500 buyers trying
/// twice for 300 units in three buckets. No 503, every unit sold, the stock left 0 in every
/// bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_over_http_buys_every_unit_of_a_bucketed_sale_without_a_503() -> anyhow::Result<()>
{
    use axum::http::StatusCode;
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(300, 1, 3).await?;
    let app = env.entry_router();
    let requests: Vec<String> = (0..2)
        .flat_map(|_| (0..1500).map(|i| format!("crowd-{i}")))
        .collect();
    let answers: Vec<(StatusCode, serde_json::Value)> = futures::stream::iter(&requests)
        .map(|user| {
            let (app, a) = (&app, &a);
            async move { testkit::buy(app, a, user, None).await }
        })
        .buffer_unordered(128)
        .collect()
        .await;
    let count = |s: StatusCode| answers.iter().filter(|(status, _)| *status == s).count();
    let unavailable: Vec<&serde_json::Value> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(_, b)| b)
        .take(3)
        .collect();
    assert_eq!(count(StatusCode::SERVICE_UNAVAILABLE), 0, "{unavailable:?}");
    assert_eq!(count(StatusCode::ACCEPTED), 300);
    assert_eq!(count(StatusCode::CONFLICT), requests.len() - 300);
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stamp_of_an_older_token_never_replaces_a_newer_one() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_sale_in_buckets(3, 1, 3).await?;
    let stamp = env
        .redis
        .bucket_keys(Bucket::all(a.id, 3).nth(1).unwrap())
        .lock;
    let stamp_with = |owner: &'static str, token: i64| {
        let (redis, stamp) = (env.redis.clone(), stamp.clone());
        async move {
            let mut inv = seckill_shared::store::scripts::LOCK_STAMP.prepare_invoke();
            inv.key(&stamp).arg(owner).arg(60_000).arg(token);
            redis.script::<i64>(&inv).await
        }
    };
    assert_eq!(stamp_with("newer", 8).await?, 1);
    assert_eq!(
        stamp_with("older", 7).await?,
        0,
        "the older holder is refused"
    );
    let holds: std::collections::HashMap<String, i64> =
        env.redis.cmd(redis::cmd("HGETALL").arg(&stamp)).await?;
    assert_eq!(holds.get("newer"), Some(&1));
    assert_eq!(holds.get("token"), Some(&8));
    assert!(!holds.contains_key("older"));
    assert_eq!(
        stamp_with("newest", 9).await?,
        1,
        "a newer holder takes over"
    );
    Ok(())
}
