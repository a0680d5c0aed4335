//! The admin function and the fenced lock against real Redis (standalone and cluster) and
//! real PostgreSQL: a paused holder fenced out, a wiped token counter, concurrent admins,
//! owner-checked release, renewals, live stock changes during a sale, and bad input.

use admin::{router, update_activity, update_with_guard, AdminState};
use axum::http::StatusCode;
use axum::Router;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::protocol::lock;
use seckill_shared::protocol::lock::LockError;
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::Refusal;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testkit::call;
use testkit::on_both_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

use testkit::{redis_stock, set_db_stock};

const ADMIN: (&str, &str) = ("ops", "seckill:admin");
const USER: (&str, &str) = ("alice", "");

async fn setup(kind: RedisKind, lock_ttl_ms: u64, lock_wait_ms: u64) -> (TestEnv, AdminState) {
    let env = TestEnv::new(kind).await.expect("test environment");
    let state = env.admin_state_with(|c| {
        c.config.lock_ttl = Duration::from_millis(lock_ttl_ms);
        c.config.lock_wait = Duration::from_millis(lock_wait_ms);
    });
    (env, state)
}

async fn db_activity(env: &TestEnv, id: i64) -> Activity {
    activity::get(&env.pool, id).await.unwrap().unwrap()
}

async fn lock_value(env: &TestEnv, id: i64) -> Option<String> {
    testkit::lock_hold(&env.redis, id)
        .await
        .unwrap()
        .map(|hold| hold.owner)
}

fn patch(v: Value) -> ActivityPatch {
    serde_json::from_value(v).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn paused_holder_is_fenced_out_after_its_lease_expires(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: a running sale; A takes the lock with a short lease.
    let (env, state) = setup(kind, 300, 1000).await;
    let a = env.open_sale(100, 5).await?;
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
on_both_redis!(paused_holder_is_fenced_out_after_its_lease_expires);

async fn a_raw_fenced_write_with_a_lower_token_is_refused(kind: RedisKind) -> anyhow::Result<()> {
    let (env, _state) = setup(kind, 5000, 1000).await;
    let a = env.open_sale(10, 1).await?;
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
on_both_redis!(a_raw_fenced_write_with_a_lower_token_is_refused);

async fn wiped_token_counter_still_issues_tokens_above_the_database(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: three fenced writes move the DB's token up.
    let (env, state) = setup(kind, 5000, 1000).await;
    let a = env.open_sale(50, 1).await?;
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
on_both_redis!(wiped_token_counter_still_issues_tokens_above_the_database);

async fn concurrent_admin_updates_apply_in_token_order(kind: RedisKind) -> anyhow::Result<()> {
    // Arrange: a short wait so some admins really get `busy`.
    let (env, state) = setup(kind, 2000, 150).await;
    let a = env.open_sale(100, 2).await.unwrap();
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
on_both_redis!(concurrent_admin_updates_apply_in_token_order);

async fn only_the_owner_releases_and_renewals_outlive_the_ttl(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let (env, _state) = setup(kind, 300, 100).await;
    let a = env.open_sale(10, 1).await?;
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
on_both_redis!(only_the_owner_releases_and_renewals_outlive_the_ttl);

async fn work_is_abandoned_when_the_lease_is_taken_over(kind: RedisKind) -> anyhow::Result<()> {
    let (env, _state) = setup(kind, 300, 100).await;
    let a = env.open_sale(10, 1).await?;
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
on_both_redis!(work_is_abandoned_when_the_lease_is_taken_over);

async fn live_stock_changes_conserve_stock_with_concurrent_buyers(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: a running sale of 200, 300 buyers of one unit each.
    let (env, state) = setup(kind, 2000, 2000).await;
    let a = env.open_sale(200, 1).await.unwrap();
    let buyers: Vec<_> = (0..300)
        .map(|i| {
            let redis = env.redis.clone();
            tokio::spawn(async move {
                tokio::time::sleep(ms((i % 30) * 5)).await;
                testkit::purchase(
                    &redis,
                    a.id,
                    &format!("u{i}"),
                    1,
                    Uuid::new_v4(),
                    purchase::far_deadline(),
                )
                .await
                .unwrap()
            })
        })
        .collect();

    // Act: meanwhile an admin raises and lowers the total.
    let mut applied = Vec::new();
    for total in [260, 230, 320, 240, 280, 150] {
        match update_activity(&state, a.id, &patch(json!({"totalStock": total}))).await {
            Ok(row) => applied.push(row.total_stock),
            Err(e) => assert_eq!(e.code(), "conflict", "{e}"),
        }
        tokio::time::sleep(ms(10)).await;
    }
    let mut accepted = 0;
    for b in buyers {
        match b.await.unwrap() {
            Ok(Reservation { stock_left, .. }) => {
                assert!(stock_left >= 0);
                accepted += 1;
            }
            Err(Refusal::SoldOut { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    // Assert: conservation (nothing consumed, so confirmed = 0), no oversell.
    assert!(!applied.is_empty());
    let row = db_activity(&env, a.id).await;
    let snap = ledger::snapshot(&env.redis, a.id).await.unwrap();
    let stock = snap.stock.unwrap();
    assert!(stock >= 0);
    assert_eq!(snap.pending_count(), accepted);
    assert_eq!(
        stock + snap.pending_quantity(),
        row.total_stock,
        "redis_stock + pending = total"
    );
    assert!(snap.pending_quantity() <= row.total_stock);
    assert_eq!(row.remaining_stock, row.total_stock);
    assert_eq!(row.config_version, 1 + applied.len() as i64);

    // Lowering below what is reserved is refused and changes nothing.
    let sold = snap.pending_quantity();
    let err = update_activity(&state, a.id, &patch(json!({"totalStock": sold - 1})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "conflict");
    assert_eq!(err.status(), StatusCode::CONFLICT);
    let after = db_activity(&env, a.id).await;
    assert_eq!(
        (after.total_stock, after.config_version),
        (row.total_stock, row.config_version)
    );
    assert_eq!(redis_stock(&env, a.id).await, Some(stock));

    // Lowering to exactly what is reserved sells out and conserves.
    if sold > 0 {
        update_activity(&state, a.id, &patch(json!({"totalStock": sold})))
            .await
            .unwrap();
        assert_eq!(redis_stock(&env, a.id).await, Some(0));
    }

    // The detail view reports zero drift.
    let app = router(state);
    let (status, body) = call(
        &app,
        request(
            "GET",
            &format!("/admin/activities/{}", a.id),
            Some(ADMIN),
            None,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stats"]["drift"], json!(0), "{body}");
    assert_eq!(body["stats"]["pendingCount"], json!(accepted), "{body}");
    assert_eq!(body["stats"]["participants"], json!(accepted), "{body}");
    Ok(())
}
on_both_redis!(live_stock_changes_conserve_stock_with_concurrent_buyers);

async fn lowering_below_db_sold_is_refused_even_when_not_loaded(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // An activity the DB knows is partly sold but Redis has not loaded (or already dropped).
    let (env, state) = setup(kind, 2000, 1000).await;
    let app = router(state.clone());
    let now = Utc::now();
    let body = json!({
        "title": "later", "totalStock": 10, "perOrderLimit": 1, "priceMinor": 1999, "currency": "usd",
        "startAt": (now + ChronoDuration::days(1)).to_rfc3339(),
        "endAt": (now + ChronoDuration::days(2)).to_rfc3339(),
    });
    let (status, created) = call(
        &app,
        request(
            "POST",
            "/admin/activities",
            Some(ADMIN),
            Some(&body.to_string()),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().unwrap();
    set_db_stock(&env, id, 4).await;

    let err = update_activity(&state, id, &patch(json!({"totalStock": 5})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "conflict");
    let ok = update_activity(&state, id, &patch(json!({"totalStock": 6})))
        .await
        .unwrap();
    assert_eq!((ok.total_stock, ok.remaining_stock), (6, 0));
    assert_eq!(
        redis_stock(&env, id).await,
        None,
        "admin never loads a sale"
    );

    let (_, detail) = call(
        &app,
        request("GET", &format!("/admin/activities/{id}"), Some(ADMIN), None),
    )
    .await;
    assert_eq!(detail["stats"]["redisStock"], Value::Null);
    assert_eq!(detail["stats"]["drift"], Value::Null);
    assert_eq!(detail["stats"]["dbRemaining"], json!(0));
    Ok(())
}
on_both_redis!(lowering_below_db_sold_is_refused_even_when_not_loaded);

/// Every way to get an admin request wrong, through the router; none of them changes the DB.
/// One refused admin request: method, path, token, body, status, error code.
type BadRequest<'a> = (
    &'a str,
    String,
    Option<(&'a str, &'a str)>,
    Option<String>,
    u16,
    &'a str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_admin_requests_are_refused_and_change_nothing() -> anyhow::Result<()> {
    let (env, state) = setup(RedisKind::Standalone, 2000, 500).await;
    let app: Router = router(state);
    let now = Utc::now();
    let start = (now + ChronoDuration::hours(1)).to_rfc3339();
    let end = (now + ChronoDuration::hours(2)).to_rfc3339();
    let valid = json!({"title": "Phones", "totalStock": 10, "perOrderLimit": 2, "priceMinor": 1999, "currency": "usd",
                       "startAt": start, "endAt": end});

    // Arrange: one good activity.
    let (status, created) = call(
        &app,
        request(
            "POST",
            "/admin/activities",
            Some(ADMIN),
            Some(&valid.to_string()),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().unwrap();
    assert_eq!(created["totalStock"], json!(10));
    assert_eq!(created["remainingStock"], json!(10));
    assert_eq!(created["perOrderLimit"], json!(2));
    assert_eq!(created["configVersion"], json!(1));
    assert_eq!(
        created["perUserRatePerSec"],
        json!(10),
        "a sale that names no rate gets the default one"
    );
    assert_eq!(
        (&created["priceMinor"], &created["currency"]),
        (&json!(1999), &json!("usd"))
    );
    let path = format!("/admin/activities/{id}");
    let before = db_activity(&env, id).await;

    // Every refused request, one row each: method, path, token, body, status, code.
    let unknown = format!("/admin/activities/{}", id + 1000);
    let (p, u) = (path.as_str(), unknown.as_str());
    let oversized = format!("{{\"title\": \"{}\"}}", "x".repeat(5000));
    let body = valid.to_string();
    let v = Some(body.as_str());
    let t = Some(r#"{"title":"x"}"#);
    let (bad, none, auth, forbidden) = (400, 404, 401, 403);
    #[rustfmt::skip]
    let mut cases: Vec<BadRequest> = [
        ("POST", "/admin/activities", None, v, auth, "unauthorized"),
        ("GET", "/admin/activities", None, v, auth, "unauthorized"),
        ("GET", p, None, v, auth, "unauthorized"),
        ("PUT", p, None, v, auth, "unauthorized"),
        ("POST", "/admin/activities", Some(USER), v, forbidden, "forbidden"),
        ("GET", "/admin/activities", Some(USER), v, forbidden, "forbidden"),
        ("GET", p, Some(USER), v, forbidden, "forbidden"),
        ("PUT", p, Some(USER), v, forbidden, "forbidden"),
        ("PUT", p, Some(ADMIN), Some(""), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some("{}"), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some("{\"title\": "), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some("[1,2]"), bad, "bad_request"),
        ("PUT", p, Some(ADMIN), Some(oversized.as_str()), bad, "bad_request"),
        ("POST", "/admin/activities", Some(ADMIN), Some("{\"title\": \"x\"}"), bad, "bad_request"),
        ("GET", "/admin/activities/abc", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities/0", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities/-1", Some(ADMIN), None, bad, "bad_request"),
        ("PUT", "/admin/activities/abc", Some(ADMIN), t, bad, "bad_request"),
        ("PUT", "/admin/activities/0", Some(ADMIN), t, bad, "bad_request"),
        ("PUT", "/admin/activities/-1", Some(ADMIN), t, bad, "bad_request"),
        ("GET", u, Some(ADMIN), None, none, "not_found"),
        ("PUT", u, Some(ADMIN), t, none, "not_found"),
        ("GET", "/admin/activities?limit=0", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?limit=101", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?limit=abc", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?offset=-1", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?offset=x", Some(ADMIN), None, bad, "bad_request"),
        ("GET", "/admin/activities?page=2", Some(ADMIN), None, bad, "bad_request"),
    ]
    .into_iter()
    .map(|(m, p, who, b, status, code)| (m, p.to_string(), who, b.map(String::from), status, code))
    .collect();

    // Bad fields, one row each, tried on create (merged into a valid body) and on update.
    let bad_fields: Vec<Value> = vec![
        json!({"title": ""}),
        json!({"title": "   "}),
        json!({"title": "x".repeat(201)}),
        json!({"totalStock": 0}),
        json!({"totalStock": -5}),
        json!({"totalStock": 1_000_000_000_000i64}),
        json!({"totalStock": "10"}),
        json!({"perOrderLimit": 0}),
        json!({"startAt": end, "endAt": start}),
        json!({"startAt": start, "endAt": start}),
        json!({"startAt": "tomorrow at noon"}),
        json!({"title": "a\u{0}b"}),
        json!({"title": "a\nb"}),
        json!({"startAt": "1969-12-31T23:59:59Z"}),
        json!({"endAt": "9999-12-31T23:59:59-23:59"}),
        json!({"price": 10}),
        json!({"priceMinor": 0}),
        json!({"priceMinor": 100_000_000}),
        json!({"currency": "dollars"}),
        json!({"currency": "u$d"}),
    ];
    for field in bad_fields {
        let mut create = valid.clone();
        for (k, v) in field.as_object().unwrap() {
            create[k] = v.clone();
        }
        let admin = Some(ADMIN);
        cases.push((
            "POST",
            "/admin/activities".into(),
            admin,
            Some(create.to_string()),
            bad,
            "bad_request",
        ));
        cases.push((
            "PUT",
            path.clone(),
            admin,
            Some(field.to_string()),
            bad,
            "bad_request",
        ));
    }

    for (method, p, who, body, want_status, want_code) in cases {
        let (status, json) = call(&app, request(method, &p, who, body.as_deref())).await;
        let shown = body.as_deref().map(|b| &b[..b.len().min(60)]);
        assert_eq!(
            status.as_u16(),
            want_status,
            "{method} {p} {shown:?}: {json}"
        );
        assert_eq!(
            json["error"],
            json!(want_code),
            "{method} {p} {shown:?}: {json}"
        );
        assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {p}: a message says what is wrong"
        );
    }

    // Nothing changed: one activity, exactly as created.
    let count: i64 = sqlx::query_scalar("select count(*) from activities")
        .fetch_one(&env.pool)
        .await?;
    assert_eq!(count, 1);
    let after = db_activity(&env, id).await;
    assert_eq!(
        (
            after.title,
            after.total_stock,
            after.config_version,
            after.last_fence_token
        ),
        (before.title, before.total_stock, 1, before.last_fence_token)
    );

    // The good paths still answer.
    let (status, page) = call(&app, request("GET", "/admin/activities", Some(ADMIN), None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (page["limit"].clone(), page["offset"].clone()),
        (json!(20), json!(0))
    );
    assert_eq!(page["items"][0]["id"], json!(id));
    let (status, page) = call(
        &app,
        request(
            "GET",
            "/admin/activities?limit=1&offset=1",
            Some(ADMIN),
            None,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["items"], json!([]));
    let (status, updated) = call(
        &app,
        request("PUT", &path, Some(ADMIN), Some("{\"perOrderLimit\": 3}")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["perOrderLimit"], json!(3));
    assert_eq!(updated["title"], json!("Phones"));
    assert_eq!(updated["configVersion"], json!(2));
    Ok(())
}

async fn a_failed_db_write_gives_redis_its_units_back(kind: RedisKind) -> anyhow::Result<()> {
    // Arrange: a running sale, and a database that refuses one particular update (a real
    // failure inside the transaction, after Redis was already lowered).
    let (env, state) = setup(kind, 2000, 1000).await;
    let a = env.open_sale(20, 1).await?;
    for stmt in [
        "create function refuse_13() returns trigger language plpgsql as $$
         begin
           if new.total_stock = 13 then raise exception 'refused by test trigger'; end if;
           return new;
         end $$",
        "create trigger refuse_13 before update on activities
         for each row execute function refuse_13()",
    ] {
        sqlx::query(stmt).execute(&env.pool).await?;
    }

    // Act: lower 20 -> 13 (Redis first, then the DB fails).
    let err = update_activity(&state, a.id, &patch(json!({"totalStock": 13})))
        .await
        .unwrap_err();

    // Assert: an error, and both stores are as before: Redis got its 7 units back.
    assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR, "{err}");
    let row = db_activity(&env, a.id).await;
    assert_eq!((row.total_stock, row.config_version), (20, 1));
    assert_eq!(redis_stock(&env, a.id).await, Some(20));
    let total: String = env
        .redis
        .cmd(
            redis::cmd("HGET")
                .arg(env.redis.keys(a.id).meta)
                .arg("total"),
        )
        .await?;
    assert_eq!(total, "20");
    // And the next change goes through normally.
    update_activity(&state, a.id, &patch(json!({"totalStock": 12}))).await?;
    assert_eq!(redis_stock(&env, a.id).await, Some(12));
    Ok(())
}
on_both_redis!(a_failed_db_write_gives_redis_its_units_back);
