//! Preheat: twice leaves a loaded sale unchanged, never resets the stock while purchases run,
//! reloads a running sale missing from Redis, and gives a meta without its `terms` (kept by a
//! build before them) the terms of its own fields.

use crate::{env, insert_activity};
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity::Activity;
use seckill_shared::store::purchase;
use seckill_shared::store::values::SaleTerms;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{is_participant, redis_stock, reserve};
use uuid::Uuid;

on_every_redis!(
    a_preheat_whose_time_is_spent_begins_no_load_and_the_next_run_loads,
    preheat_twice_leaves_a_loaded_sale_unchanged,
    preheat_concurrent_with_purchases_never_resets_stock,
    preheat_reloads_a_running_sale_missing_from_redis,
    preheat_gives_a_meta_without_terms_those_of_its_fields,
);

async fn preheat_twice_leaves_a_loaded_sale_unchanged(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = running(&env, 20).await?;
    let job = env.preheat();

    let first = job.run(Utc::now()).await?;
    assert_eq!(first.loaded_ids, vec![a.id]);
    reserve(&env, a.id, "alice", 3).await;

    let second = job.run(Utc::now()).await?;
    assert_eq!(second.loaded, 0);
    assert_eq!(second.already_loaded_ids, vec![a.id]);
    assert!(second.errors.is_empty());
    // The database still says 20 (no consumer ran): a reset would have put 20 back.
    assert_eq!(redis_stock(&env, a.id).await, Some(17));
    assert!(is_participant(&env, a.id, "alice").await);
    Ok(())
}

async fn preheat_concurrent_with_purchases_never_resets_stock(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = Arc::new(env(kind).await?);
    let a = running(&env, 300).await?;
    let job = Arc::new(env.preheat());
    job.run(Utc::now()).await?;

    let done = Arc::new(AtomicBool::new(false));
    let preheaters: Vec<_> = (0..2)
        .map(|_| {
            let (job, done) = (job.clone(), done.clone());
            tokio::spawn(async move {
                let mut runs = 0;
                while !done.load(Ordering::SeqCst) || runs == 0 {
                    let report = job.run(Utc::now()).await?;
                    assert_eq!(report.loaded, 0, "a loaded sale was loaded again");
                    runs += 1;
                }
                anyhow::Ok(runs)
            })
        })
        .collect();
    let buyers: Vec<_> = (0..200)
        .map(|i| {
            let env = env.clone();
            tokio::spawn(async move {
                let d = testkit::purchase(
                    &env.redis,
                    a.id,
                    &format!("u{i}"),
                    1,
                    Uuid::new_v4(),
                    purchase::far_deadline(),
                )
                .await?;
                anyhow::Ok(d.is_ok())
            })
        })
        .collect();
    let mut accepted = 0;
    for b in buyers {
        accepted += i64::from(b.await??);
    }
    done.store(true, Ordering::SeqCst);
    let mut runs = 0;
    for p in preheaters {
        runs += p.await??;
    }

    assert!(runs >= 2, "preheat ran {runs} times");
    assert_eq!(accepted, 200);
    assert_eq!(redis_stock(&env, a.id).await, Some(300 - accepted));
    Ok(())
}

async fn preheat_reloads_a_running_sale_missing_from_redis(kind: RedisKind) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let now = Utc::now();
    let running = env.open_activity(10, 1).await?;
    let soon = insert_activity(
        &env,
        5,
        now + ChronoDuration::minutes(10),
        now + ChronoDuration::hours(1),
    )
    .await?;
    let later = insert_activity(
        &env,
        5,
        now + ChronoDuration::hours(5),
        now + ChronoDuration::hours(6),
    )
    .await?;
    // The cache lost the running sale (failover, flush, eviction).
    let k = env.redis.keys(running.id);
    let _: i64 = env.redis.cmd(redis::cmd("DEL").arg(&k.meta)).await?;

    let report = env.preheat().run(Utc::now()).await?;

    assert_eq!(report.loaded_ids, vec![running.id, soon.id]);
    assert!(!report.already_loaded_ids.contains(&later.id));
    assert_eq!(redis_stock(&env, running.id).await, Some(10));
    assert_eq!(redis_stock(&env, soon.id).await, Some(5));
    assert_eq!(redis_stock(&env, later.id).await, None);
    // Every loaded key expires exactly at the sale's end plus the buffer.
    for a in [&running, &soon] {
        let k = env.redis.keys(a.id);
        let expected = a.expire_at(env.config.expiry_buffer).timestamp_millis();
        for key in [&k.meta, &k.users, &k.ledger] {
            let at: i64 = env.redis.cmd(redis::cmd("PEXPIRETIME").arg(key)).await?;
            assert_eq!(at, expected, "{key}");
        }
    }
    Ok(())
}

/// A run begins no load past its invocation's deadline (less its margin): what it could not
/// begin it reports deferred, and the next run loads it. Without the bound, a run that met
/// several lost draw sales, each rebuilding its pool, went past the function's Timeout.
async fn a_preheat_whose_time_is_spent_begins_no_load_and_the_next_run_loads(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = running(&env, 20).await?;
    let job = env.preheat();

    // An invocation whose deadline is closer than the run's margin.
    let spent = tokio::time::Instant::now() + preheat::FINISH_MARGIN / 2;
    let report = job.run_by(Utc::now(), spent.into_std()).await?;

    assert_eq!(report.deferred_ids, vec![a.id], "{report:?}");
    assert_eq!(report.loaded, 0);
    assert_eq!(redis_stock(&env, a.id).await, None);
    let next = job.run(Utc::now()).await?;
    assert_eq!(next.loaded_ids, vec![a.id]);
    assert_eq!(redis_stock(&env, a.id).await, Some(20));
    Ok(())
}

/// A sale loaded by a build before the meta kept `terms` (none), and one whose fields a build
/// that does not know them changed since (`limit` and `version` moved, the terms not): either
/// way a purchase that carries the old terms is decided by the fields, and preheat's next run
/// puts in the terms made of the meta's own fields (not of the database row it was given) and
/// touches nothing else; a purchase then carries them.
async fn preheat_gives_a_meta_without_terms_those_of_its_fields(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = env(kind).await?;
    let a = running(&env, 20).await?;
    let job = env.preheat();
    job.run(Utc::now()).await?;
    let meta = env.redis.keys(a.id).meta;
    let hset = |field: &'static str, value: i64| {
        let cmd = redis::cmd("HSET").arg(&meta).arg(field).arg(value).clone();
        let redis = env.redis.clone();
        async move { redis.cmd::<()>(&cmd).await }
    };
    let buy = |user: String, qty| {
        let redis = env.redis.clone();
        async move {
            let (id, far) = (Uuid::now_v7(), purchase::far_deadline());
            testkit::purchase(&redis, a.id, &user, qty, id, far).await
        }
    };
    // The load wrote the terms of the row's limit, 5; the handle carries them once it bought.
    assert!(buy("first".into(), 1).await?.is_ok());
    assert!(env.redis.terms.get(a.id).is_some());

    for (older, limit) in [("no terms", 4), ("stale terms", 3)] {
        if older == "no terms" {
            let _: () = env
                .redis
                .cmd(redis::cmd("HDEL").arg(&meta).arg("terms"))
                .await?;
            hset("limit", limit).await?;
        } else {
            // An older build's admin change: committed in the row, then written into the meta
            // as that build writes it, the field and the new version and no terms.
            let version: i64 = sqlx::query_scalar(
                "update activities set per_order_limit = $2, config_version = config_version + 1
                 where id = $1 returning config_version",
            )
            .bind(a.id)
            .bind(limit)
            .fetch_one(&env.pool)
            .await?;
            hset("limit", limit).await?;
            hset("version", version).await?;
        }
        // The copy in hand says more than the limit: the fields decide.
        let over = buy(format!("over-{limit}"), limit + 1).await?;
        assert_eq!(
            over.unwrap_err().code(),
            "quantity_exceeds_limit",
            "{older}"
        );

        let again = job.run(Utc::now()).await?;
        assert!(again.errors.is_empty(), "{again:?}");
        let terms = purchase::read_terms(&env.redis, a.id.into()).await?;
        let fields: Vec<Option<String>> = env
            .redis
            .cmd(redis::cmd("HMGET").arg(&meta).arg(&SaleTerms::FIELDS[..]))
            .await?;
        let fields: Vec<String> = fields.into_iter().map(Option::unwrap_or_default).collect();
        assert_eq!(
            terms.as_ref().map(|t| t.text()),
            Some(fields.join(":").as_str()),
            "{older}"
        );
        assert_eq!(
            fields[3],
            limit.to_string(),
            "{older}: the meta's limit, not the row's"
        );
        // Carried now, the terms decide as the fields do.
        assert!(buy(format!("at-{limit}"), limit).await?.is_ok(), "{older}");
        assert_eq!(
            env.redis.terms.get(a.id).as_deref(),
            terms.as_ref(),
            "{older}"
        );
        let over = buy(format!("over-again-{limit}"), limit + 1).await?;
        assert_eq!(
            over.unwrap_err().code(),
            "quantity_exceeds_limit",
            "{older}"
        );
    }
    Ok(())
}

/// A sale in the database only, its window open since a minute ago for an hour.
async fn running(env: &TestEnv, stock: i64) -> anyhow::Result<Activity> {
    let now = Utc::now();
    insert_activity(
        env,
        stock,
        now - ChronoDuration::minutes(1),
        now + ChronoDuration::hours(1),
    )
    .await
}
