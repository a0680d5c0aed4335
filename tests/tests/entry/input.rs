//! What a request says and what it is answered: the user from the token only, every bad input's
//! documented 4xx with nothing changed, the window's refusals as their 409s, the public view's
//! live stock.

use crate::orders_path;
use axum::http::StatusCode;
use seckill_shared::domain::activity;
use testkit::call;
use testkit::on_every_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{buy, db_remaining, orders_in_db, snapshot};

on_every_redis!(
    user_id_in_the_body_is_ignored_in_favour_of_the_token,
    every_bad_input_gets_its_documented_4xx_and_changes_nothing,
    refusals_of_the_window_map_to_their_409s,
    public_view_shows_live_stock_from_redis,
);

async fn user_id_in_the_body_is_ignored_in_favour_of_the_token(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(5, 2).await?;

    let (status, body) = buy(
        &env.entry_router(),
        &a,
        "alice",
        Some(r#"{"quantity":1,"userId":"mallory"}"#),
    )
    .await;

    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let snap = snapshot(&env, a.id).await;
    assert_eq!(snap.ledger.len(), 1);
    assert_eq!(snap.ledger[0].user_id, "alice");
    Ok(())
}

/// method, path, (user, scope), body, expected status, expected error code.
type BadInput<'a> = (
    &'a str,
    String,
    Option<(&'a str, &'a str)>,
    Option<&'a str>,
    u16,
    &'a str,
);

async fn every_bad_input_gets_its_documented_4xx_and_changes_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(10, 5).await?;
    let app = env.entry_router();
    let orders = orders_path(&a);
    let huge = format!(r#"{{"quantity":1,"userId":"{}"}}"#, "x".repeat(5000));
    let user = Some(("alice", ""));
    #[rustfmt::skip]
    let cases: Vec<BadInput> = vec![
        ("POST", orders.clone(), user, Some(r#"{"quantity":"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some("not json"), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":"2"}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1.5}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":true}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":null}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some("[1]"), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":-1}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":0}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":10001}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":99999999999999999999}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1e30}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1,"quantiy":2}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":1,"quantity":2}"#), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(huge.as_str()), 400, "bad_request"),
        ("POST", orders.clone(), user, Some(r#"{"quantity":6}"#), 400, "quantity_exceeds_limit"),
        ("POST", orders.clone(), None, None, 401, "unauthorized"),
        ("POST", "/activities/abc/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/0/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/-1/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/1.5/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/99999999999999999999/orders".into(), user, None, 400, "bad_request"),
        ("POST", "/activities/987654321/orders".into(), user, None, 404, "not_found"),
        ("GET", format!("{orders}/me"), None, None, 401, "unauthorized"),
        ("GET", "/activities/abc/orders/me".into(), user, None, 400, "bad_request"),
        ("GET", "/activities/abc".into(), None, None, 400, "bad_request"),
        ("GET", "/activities/987654321".into(), None, None, 404, "not_found"),
        ("POST", "/orders/abc/pay".into(), user, None, 400, "bad_request"),
        ("POST", "/orders/0/cancel".into(), user, None, 400, "bad_request"),
        ("POST", "/orders/-7/cancel".into(), user, None, 400, "bad_request"),
        ("POST", "/orders/987654321/pay".into(), user, None, 404, "not_found"),
        ("POST", "/orders/987654321/cancel".into(), user, None, 404, "not_found"),
        ("POST", "/orders/1/pay".into(), None, None, 401, "unauthorized"),
        ("GET", "/no/such/route".into(), None, None, 404, "not_found"),
    ];
    let redis_before = snapshot(&env, a.id).await;

    for (method, path, who, body, want_status, want_code) in cases {
        let (status, json) = call(&app, request(method, &path, who, body)).await;
        let shown = body.map(|b| &b[..b.len().min(60)]);
        assert_eq!(
            status.as_u16(),
            want_status,
            "{method} {path} {shown:?}: {json}"
        );
        assert_eq!(
            json["error"], want_code,
            "{method} {path} {shown:?}: {json}"
        );
        assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{method} {path}: a message says what is wrong"
        );
    }

    assert_eq!(snapshot(&env, a.id).await, redis_before, "Redis unchanged");
    assert_eq!(orders_in_db(&env).await, 0, "no order written");
    assert_eq!(db_remaining(&env, a.id).await, 10, "DB stock unchanged");
    assert!(env.drain_messages(10).await?.is_empty(), "nothing sent");
    Ok(())
}

async fn refusals_of_the_window_map_to_their_409s(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let now = chrono::Utc::now();
    let hour = chrono::Duration::hours(1);
    let upcoming = env.activity(5, 1, now + hour, now + hour * 2).await?;
    let app = env.entry_router();

    let (status, body) = buy(&app, &upcoming, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_started"))
    );

    // An activity that ended: in the DB and loaded with a past window.
    let ended = activity::insert(
        &env.pool,
        &testkit::new_activity()
            .title("over")
            .stock(5)
            .limit(1)
            .window(now - hour * 2, now - hour)
            .build()
            .settings()?,
    )
    .await?;
    testkit::load_without_db(&env.redis, &ended, env.config.expiry_buffer).await?;
    let (status, body) = buy(&app, &ended, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("ended"))
    );
    Ok(())
}

async fn public_view_shows_live_stock_from_redis(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.open_activity(7, 2).await?;
    let app = env.entry_router();
    assert_eq!(
        buy(&app, &a, "alice", Some(r#"{"quantity":2}"#)).await.0,
        StatusCode::ACCEPTED
    );

    let (status, view) = call(
        &app,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["id"], a.id);
    assert_eq!(view["title"], "test sale");
    assert_eq!(view["remainingStock"], 5, "Redis, not the DB's 7");
    assert_eq!(view["state"], "running");
    assert!(view["startAt"].is_string() && view["endAt"].is_string());
    let (status, health) = call(&app, request("GET", "/health", None, None)).await;
    assert_eq!(
        (status, health["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    Ok(())
}
