//! The fenced lock under the admin's writes: a paused holder fenced out after its lease, a lower
//! token refused, a wiped token counter still above the database, concurrent admins in token
//! order, owner-checked release and renewals, work abandoned when the lease is taken over.

use crate::{db_activity, lock_value, ms, patch, setup, ADMIN};
use admin::{router, update_activity, update_with_guard};
use axum::http::StatusCode;
use seckill_shared::protocol::lock;
use seckill_shared::protocol::lock::LockError;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use testkit::call;
use testkit::on_every_redis;
use testkit::redis_stock;
use testkit::request;
use testkit::RedisKind;

on_every_redis!(
    paused_holder_is_fenced_out_after_its_lease_expires,
    a_raw_fenced_write_with_a_lower_token_is_refused,
    wiped_token_counter_still_issues_tokens_above_the_database,
    concurrent_admin_updates_apply_in_token_order,
    only_the_owner_releases_and_renewals_outlive_the_ttl,
    work_is_abandoned_when_the_lease_is_taken_over,
);

async fn paused_holder_is_fenced_out_after_its_lease_expires(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: a running sale; A takes the lock with a short lease.
    let (env, state) = setup(kind, 300, 1000).await;
    let a = env.open_activity(100, 5).await?;
    let mut holder_a = lock::acquire(&env.redis, &env.pool, a.id, ms(300), ms(1000)).await?;
    // A "pauses" (GC, CPU starvation): in a paused process nothing runs, its watchdog
    // included, so nothing renews the lease.
    holder_a.stop_watchdog();
    tokio::time::sleep(ms(450)).await;
    assert!(holder_a.is_lost(), "A's lease ran out while it was paused");

    // B takes the expired lock and writes.
    let holder_b = lock::acquire(&env.redis, &env.pool, a.id, ms(5000), ms(1000))
        .await
        .expect("the lease expired, so B gets the lock");
    assert!(holder_b.token > holder_a.token);
    let b_wrote =
        update_with_guard(&state, &holder_b, &patch(json!({"title": "B's title"}))).await?;
    assert_eq!(b_wrote.config_version, 2);

    // Act: A resumes, unaware, and writes with its old token, raising and then lowering stock.
    let raise = update_with_guard(
        &state,
        &holder_a,
        &patch(json!({"title": "A's title", "totalStock": 150})),
    )
    .await;
    let lower = update_with_guard(&state, &holder_a, &patch(json!({"totalStock": 60}))).await;

    // Assert: both refused by the fence; B's write stands in the DB, Redis is untouched.
    assert_eq!(raise.unwrap_err().code(), "stale_token");
    assert_eq!(lower.unwrap_err().code(), "stale_token");
    let row = db_activity(&env, a.id).await;
    assert_eq!(row.title, "B's title");
    assert_eq!((row.total_stock, row.remaining_stock), (100, 100));
    assert_eq!(row.config_version, 2);
    assert_eq!(row.last_fence_token, holder_b.token);
    assert_eq!(redis_stock(&env, a.id).await, Some(100));

    // A's release cannot delete B's lock.
    let b_owner = holder_b.owner.clone();
    assert!(!holder_a.release().await?);
    assert_eq!(lock_value(&env, a.id).await, Some(b_owner));
    assert!(holder_b.release().await?);
    assert_eq!(lock_value(&env, a.id).await, None);
    Ok(())
}

async fn a_raw_fenced_write_with_a_lower_token_is_refused(kind: RedisKind) -> anyhow::Result<()> {
    let (env, _state) = setup(kind, 5000, 1000).await;
    let a = env.open_activity(10, 1).await?;
    let mut tx = env.pool.begin().await?;
    lock::fenced_update(&mut tx, a.id, 7).await?;
    tx.commit().await?;

    for token in [7, 6, 1] {
        let mut tx = env.pool.begin().await?;
        let err = lock::fenced_update(&mut tx, a.id, token).await.unwrap_err();
        assert!(
            matches!(err, LockError::StaleToken { token: t, seen: 7 } if t == token),
            "{err:?}"
        );
    }
    let mut tx = env.pool.begin().await?;
    let missing = lock::fenced_update(&mut tx, a.id + 1000, 99).await;
    assert!(matches!(
        missing,
        Err(LockError::Db(sqlx::Error::RowNotFound))
    ));
    assert_eq!(db_activity(&env, a.id).await.last_fence_token, 7);
    Ok(())
}

async fn wiped_token_counter_still_issues_tokens_above_the_database(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: three fenced writes move the DB's token up.
    let (env, state) = setup(kind, 5000, 1000).await;
    let a = env.open_activity(50, 1).await?;
    for i in 0..3 {
        update_activity(&state, a.id, &patch(json!({"title": format!("v{i}")}))).await?;
    }
    let seen = db_activity(&env, a.id).await.last_fence_token;
    assert!(seen >= 3);

    // Act: Redis forgets the counter (failover to a replica that missed it, or a flush).
    let fence_key = env.redis.keys(a.id).fence;
    let _: i64 = env.redis.cmd(redis::cmd("DEL").arg(&fence_key)).await?;
    let next = lock::acquire(&env.redis, &env.pool, a.id, ms(5000), ms(1000)).await?;

    // Assert: still above every token the DB has seen, and its write is accepted.
    assert!(next.token > seen, "{} > {seen}", next.token);
    let row = update_with_guard(&state, &next, &patch(json!({"title": "after wipe"}))).await?;
    assert_eq!(row.last_fence_token, next.token);
    assert!(next.release().await?);

    // A counter that went *backwards* (set low, not deleted) is floored the same way.
    let _: () = env
        .redis
        .cmd(redis::cmd("SET").arg(&fence_key).arg(1))
        .await?;
    let again = lock::acquire(&env.redis, &env.pool, a.id, ms(5000), ms(1000)).await?;
    assert!(again.token > row.last_fence_token);
    again.release().await?;
    Ok(())
}

async fn concurrent_admin_updates_apply_in_token_order(kind: RedisKind) -> anyhow::Result<()> {
    // Arrange: a short wait so some admins really get `busy`.
    let (env, state) = setup(kind, 2000, 150).await;
    let a = env.open_activity(100, 2).await.unwrap();
    let app = router(state);
    let path = format!("/admin/activities/{}", a.id);

    // Act: 24 admins PUT at once, each a different title and total.
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let app = app.clone();
            let path = path.clone();
            tokio::spawn(async move {
                let body = json!({"title": format!("w{i}"), "totalStock": 100 + i}).to_string();
                call(&app, request("PUT", &path, Some(ADMIN), Some(&body))).await
            })
        })
        .collect();
    let mut ok = Vec::new();
    let mut refused = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            StatusCode::OK => ok.push(body),
            StatusCode::CONFLICT => {
                let code = body["error"].as_str().unwrap();
                assert!(code == "busy" || code == "stale_token", "{body}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }

    // Assert: at least one success; the DB holds exactly the success with the highest token,
    // config_version counts the successes, and Redis followed the same final total.
    assert!(!ok.is_empty());
    assert_eq!(ok.len() + refused, 24);
    let mut tokens: Vec<i64> = ok
        .iter()
        .map(|b| b["lastFenceToken"].as_i64().unwrap())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        ok.len(),
        "every success carries its own token"
    );
    let last = ok
        .iter()
        .max_by_key(|b| b["lastFenceToken"].as_i64().unwrap())
        .unwrap();
    let row = db_activity(&env, a.id).await;
    assert_eq!(row.title, last["title"].as_str().unwrap());
    assert_eq!(row.total_stock, last["totalStock"].as_i64().unwrap());
    assert_eq!(row.remaining_stock, row.total_stock);
    assert_eq!(row.config_version, 1 + ok.len() as i64);
    assert_eq!(
        row.last_fence_token,
        last["lastFenceToken"].as_i64().unwrap()
    );
    // Versions increase with tokens: successes were applied in token order.
    let mut by_token: Vec<(i64, i64)> = ok
        .iter()
        .map(|b| {
            (
                b["lastFenceToken"].as_i64().unwrap(),
                b["configVersion"].as_i64().unwrap(),
            )
        })
        .collect();
    by_token.sort_unstable();
    assert!(by_token.windows(2).all(|w| w[0].1 < w[1].1), "{by_token:?}");
    assert_eq!(redis_stock(&env, a.id).await, Some(row.total_stock));
    assert_eq!(lock_value(&env, a.id).await, None, "every holder released");
    Ok(())
}

async fn only_the_owner_releases_and_renewals_outlive_the_ttl(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let (env, _state) = setup(kind, 300, 100).await;
    let a = env.open_activity(10, 1).await?;
    let guard = lock::acquire(&env.redis, &env.pool, a.id, ms(300), ms(100)).await?;

    // A non-owner's release changes nothing.
    assert!(!lock::release_owned(&env.redis, a.id, "someone-else").await?);
    assert_eq!(lock_value(&env, a.id).await, Some(guard.owner.clone()));

    // A long operation (3× the lease) keeps the lock through the watchdog's renewals.
    let out = guard
        .run(async {
            tokio::time::sleep(ms(900)).await;
            42
        })
        .await?;
    assert_eq!(out, 42);
    assert!(!guard.is_lost());
    assert_eq!(lock_value(&env, a.id).await, Some(guard.owner.clone()));
    let contender = lock::acquire(&env.redis, &env.pool, a.id, ms(300), ms(100)).await;
    assert!(matches!(contender, Err(LockError::Busy)));

    assert!(guard.release().await?);
    assert_eq!(lock_value(&env, a.id).await, None);
    Ok(())
}

async fn work_is_abandoned_when_the_lease_is_taken_over(kind: RedisKind) -> anyhow::Result<()> {
    let (env, _state) = setup(kind, 300, 100).await;
    let a = env.open_activity(10, 1).await?;
    let guard = lock::acquire(&env.redis, &env.pool, a.id, ms(300), ms(100)).await?;
    // Someone breaks the lock from outside (an operator, or an expiry we missed).
    let _: i64 = env
        .redis
        .cmd(redis::cmd("DEL").arg(env.redis.keys(a.id).lock))
        .await?;
    let finished = Arc::new(AtomicBool::new(false));
    let flag = finished.clone();
    let out = guard
        .run(async move {
            tokio::time::sleep(ms(2000)).await;
            flag.store(true, Ordering::SeqCst);
        })
        .await;
    assert!(matches!(out, Err(LockError::Lost)));
    assert!(guard.is_lost());
    assert!(!finished.load(Ordering::SeqCst), "the work was abandoned");
    Ok(())
}
