//! Units moving between buckets: a crash between the two steps of a borrow repaired by reconcile,
//! a slow borrower and reconcile crediting the units once, a borrow delivered twice, a unit given
//! back to a donor already asked or to the buyer's own bucket, and a cancel and a re-buy
//! across buckets.

use crate::{attempt, attempt_with, commit_all, crowd, in_users, stocks, users_at_home, CLUSTER};
use chrono::Utc;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::status::OrderStatus;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store;
use seckill_shared::store::buckets;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::keys::Home;
use seckill_shared::store::values::EntryKind;
use seckill_shared::Refusal;
use std::sync::Arc;
use std::time::Duration;
use testkit::after_grace;
use testkit::invariants;
use testkit::TestEnv;
use uuid::Uuid;

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
    let a = env.open_activity_in_buckets(9, 1, 3).await?;
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
    let a = env.open_activity_in_buckets(9, 1, 3).await?;
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
    let a = env.open_activity_in_buckets(6, 1, 3).await?;
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
    let cancelled = cancel::cancel_order(
        &env.login(Function::Entry).0,
        &env.login(Function::Entry).1,
        &row,
        Utc::now(),
    )
    .await?;
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
    assert_eq!(unpaid.status, OrderStatus::Cancelled);
    assert!(!in_users(&env, &a, &user).await);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_borrow_delivered_twice_takes_once_and_answers_what_it_took() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(12, 1, 3).await?;
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
    protocol::buckets::finish_by_id(&env.redis, donor, home, id).await?;
    protocol::buckets::finish_by_id(&env.redis, donor, home, id).await?;
    assert_eq!(stocks(&env, &a).await, vec![6, 2, 4]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A sale of three units in three buckets (`rate`: the per-user rate), each unit bought by a
/// buyer at home there; a fourth buyer at home in bucket 0 is short, asks both donors, finds
/// nothing, and pauses before her sale-wide check while the buyer of bucket `back` gives her
/// unit back (a 503's give-back, say). Answers what the short buyer was told, after checking
/// that every unit is sold again when she bought.
async fn short_buyer_while_a_unit_comes_back(
    rate: i64,
    back: usize,
) -> anyhow::Result<Result<seckill_shared::domain::purchase::OrderMessage, Refusal>> {
    let env = std::sync::Arc::new(TestEnv::new(CLUSTER).await?);
    let new = testkit::new_activity()
        .stock(3)
        .buckets(3)
        .rate(rate)
        .build();
    let a = env.load_new(&new).await?;
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
    let m = &held[back];
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
    if bought.is_ok() {
        assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
        invariants::check(&env, a.id).await?;
    }
    Ok(bought)
}

/// The unit comes back to the short buyer's own home bucket. The check reads the home bucket
/// too, and she buys the unit there on a call her per-user rate (one a second) does not count
/// again (a check of the donors alone told her `sold_out` with the unit in her own bucket).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unit_back_in_the_buyers_own_bucket_is_found_by_the_sale_wide_check() -> anyhow::Result<()>
{
    let bought = short_buyer_while_a_unit_comes_back(1, 0).await?;
    assert!(
        bought.is_ok(),
        "the unit in her own bucket was found: {bought:?}"
    );
    Ok(())
}

/// The unit comes back to a donor she already asked. The check finds it and she borrows it: no
/// `sold_out` while a unit is in stock somewhere (asking the donors one after another alone
/// told this buyer `sold_out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unit_given_back_to_a_donor_already_asked_is_found_by_the_sale_wide_check(
) -> anyhow::Result<()> {
    let bought = short_buyer_while_a_unit_comes_back(0, 1).await?;
    assert!(bought.is_ok(), "the unit given back was found: {bought:?}");
    Ok(())
}

/// A buyer of several units borrows part of what she is short of, from the one donor her
/// container's hints did not skip; the skipped donor, found empty a moment ago by another
/// buyer's borrow, is given units back while she is between her hints and her borrows. She is
/// told `sold_out` only after a sale-wide check, which finds those units, and buys (without
/// the check, the units in hand were put into her home bucket and she was told `sold_out`
/// with enough units in the sale, an answer her entry remembers and repeats to every buyer of
/// as many units for a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partial_borrow_checks_the_whole_sale_before_sold_out() -> anyhow::Result<()> {
    let env = std::sync::Arc::new(TestEnv::new(CLUSTER).await?);
    let a = env.open_activity_in_buckets(9, 4, 3).await?;
    let mut held = std::collections::HashMap::new();
    for (index, buyers) in [(0, 3), (1, 1), (2, 3)] {
        let mut messages = Vec::new();
        for user in users_at_home(a.id, 3, index, buyers, "first") {
            messages.push(attempt(&env, &a, &user, 1, 3).await?.expect("own stock"));
        }
        held.insert(index, messages);
    }
    assert_eq!(stocks(&env, &a).await, vec![0, 2, 0]);
    let hints = protocol::buckets::Hints::new();

    // Three asked of a sale holding two: bucket 1 gives both, bucket 2 is found empty (and
    // skipped by this container's next borrows for a second); the two wait in bucket 0.
    let first = users_at_home(a.id, 3, 0, 1, "three")[0].clone();
    let told = attempt_with(&env, &hints, &a, &first, 3, 3).await?;
    assert!(matches!(told, Err(Refusal::SoldOut { .. })), "{told:?}");
    assert_eq!(stocks(&env, &a).await, vec![2, 0, 0]);
    let give_back = |m: &seckill_shared::domain::purchase::OrderMessage| {
        let env = env.clone();
        let (home, user, request) = (m.home(), m.attempt.user_id.clone(), m.attempt.request_id);
        async move {
            store::ledger::compensate(
                &env.redis,
                home,
                &user,
                request,
                store::ledger::Compensation::Full,
            )
            .await
        }
    };
    assert_eq!(give_back(&held[&1][0]).await?, Some(1));
    assert_eq!(stocks(&env, &a).await, vec![2, 1, 0]);

    // Four asked: two at home, one from bucket 1; bucket 2 is skipped on the hint while two of
    // its units come back.
    let paused = pause::arm("purchase.borrow", a.id);
    let four = {
        let (env, a, hints) = (env.clone(), a.clone(), hints.clone());
        let user = users_at_home(a.id, 3, 0, 1, "four")[0].clone();
        tokio::spawn(async move { attempt_with(&env, &hints, &a, &user, 4, 3).await.unwrap() })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    for m in &held[&2][..2] {
        assert_eq!(give_back(m).await?, Some(1));
    }
    assert_eq!(stocks(&env, &a).await, vec![2, 1, 2], "five units for four");
    paused.resume();
    let bought = four.await?;
    assert!(
        bought.as_ref().is_ok_and(|m| m.attempt.quantity == 4),
        "four units of five in stock: {bought:?}"
    );
    assert_eq!(stocks(&env, &a).await.iter().sum::<i64>(), 1);
    invariants::check(&env, a.id).await?;
    Ok(())
}
