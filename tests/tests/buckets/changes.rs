//! Changes of a bucketed sale: an admin's lower takes from the buckets that hold units, the bucket
//! count changes only before the start, the public view adds the buckets up and a lost bucket
//! reloads the whole sale, a stock fix across buckets, and the fence of each bucket's writes.

use crate::{attempt, commit_all, crowd, stocks, users_at_home, CLUSTER};
use chrono::Utc;
use seckill_shared::domain::activity;
use seckill_shared::domain::order;
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::store::buckets;
use seckill_shared::store::keys;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::meta;
use seckill_shared::store::view;
use seckill_shared::ApiError;
use seckill_shared::Refusal;
use std::sync::Arc;
use std::time::Duration;
use testkit::invariants;
use testkit::TestEnv;
use uuid::Uuid;

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
    let a = env.open_activity_in_buckets(30, 1, 3).await?;
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
        .activity_in_buckets(12, 1, start, start + chrono::Duration::hours(1), 3)
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
    let running = env.open_activity_in_buckets(12, 1, 3).await?;
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
    let a = env.open_activity_in_buckets(10, 2, 3).await?;
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
    let a = env.open_activity_in_buckets(9, 1, 3).await?;
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
    let cancelled = cancel::cancel_order(
        &env.login(Function::Entry).0,
        &env.login(Function::Entry).1,
        &row,
        Utc::now(),
    )
    .await?;
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
    let a = env.open_activity_in_buckets(9, 1, 3).await?;
    let ttl = Duration::from_millis(300);
    let mut stale =
        seckill_shared::protocol::lock::acquire(&env.redis, &env.pool, a.id, ttl, ttl).await?;
    stale.stop_watchdog();
    tokio::time::sleep(ttl * 2).await;
    let next =
        seckill_shared::protocol::lock::acquire(&env.redis, &env.pool, a.id, ttl * 10, ttl).await?;
    let bucket = Bucket::all(a.id, 3).nth(2).unwrap();
    let meta = meta::ActivityMeta {
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
async fn a_stamp_of_an_older_token_never_replaces_a_newer_one() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(3, 1, 3).await?;
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
