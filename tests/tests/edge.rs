//! No way around the edge: with the origin secret set, the entry's and the admin's routers
//! refuse every request without `x-origin-verify` = one of its values (403) before any handler
//! runs, so before Redis or the database; `GET /health/deep` stays reachable for IAM-signed
//! monitors. The secret's current and previous values (a rotation) are read from Secrets
//! Manager (the local emulator).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::infra::config::{EdgeOrigin, OriginValue};
use seckill_shared::Context;
use serde_json::Value;
use testkit::{call, request, RedisKind, TestEnv};
use testkit::{dead_pool, redis_stock};

const CURRENT: &str = "origin-current-0123456789";
const PREVIOUS: &str = "origin-previous-0123456789";
const RETIRED: &str = "origin-retired-0123456789";

/// The current value, a previous one still within its time, and one past it.
fn origin() -> EdgeOrigin {
    EdgeOrigin {
        secret: Some(CURRENT.to_string().into()),
        from_arn: vec![
            OriginValue {
                value: PREVIOUS.to_string().into(),
                until: Some(Utc::now() + ChronoDuration::hours(1)),
            },
            OriginValue {
                value: RETIRED.to_string().into(),
                until: Some(Utc::now() - ChronoDuration::seconds(1)),
            },
        ],
        ..EdgeOrigin::default()
    }
}

/// The entry's router with the origin secret on, on a context `adjust` changed.
fn entry(env: &TestEnv, adjust: impl FnOnce(&mut Context)) -> Router {
    env.entry_router_with(|c| {
        adjust(c);
        c.config.edge_origin = origin();
    })
}

/// `req` with `x-origin-verify: value`.
fn via(value: &str, mut req: Request<Body>) -> Request<Body> {
    req.headers_mut()
        .insert("x-origin-verify", value.parse().unwrap());
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_without_the_origin_secret_is_refused_before_any_work() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let activity = env.open_activity(5, 1).await?;
    let app = entry(&env, |_| {});
    let buy = || {
        let path = format!("/activities/{}/orders", activity.id);
        request("POST", &path, Some(("alice", "")), Some("{}"))
    };

    for (what, req) in [
        ("no header", buy()),
        ("a wrong value", via("guess", buy())),
        ("a prefix of the value", via(&CURRENT[..10], buy())),
        ("a previous value past its time", via(RETIRED, buy())),
    ] {
        let (status, body) = call(&app, req).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::FORBIDDEN, Some("forbidden")),
            "{what}: {body}"
        );
    }
    assert_eq!(
        redis_stock(&env, activity.id).await,
        Some(5),
        "nothing was sold"
    );
    let (status, body) = call(&app, via(CURRENT, buy())).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    // On a database out of reach, an unknown id would cost a read and answer 503: refused
    // first, it costs none.
    let app = entry(&env, |c| c.pool = dead_pool());
    let unknown = || request("GET", "/activities/987654321", None, None);
    assert_eq!(call(&app, unknown()).await.0, StatusCode::FORBIDDEN);
    assert_eq!(
        call(&app, via(PREVIOUS, unknown())).await.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "the previous value of a rotation is let through"
    );
    // The deep health check is the one route monitors reach without the edge.
    let (status, _) = call(&app, request("GET", "/health/deep", None, None)).await;
    assert_ne!(status, StatusCode::FORBIDDEN);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_routes_need_the_origin_secret_too() -> anyhow::Result<()> {
    let env = TestEnv::new(RedisKind::Standalone).await?;
    let app = env.admin_router_with(|c| c.config.edge_origin = origin());
    let list = || {
        request(
            "GET",
            "/admin/activities",
            Some(("ops", "seckill:admin")),
            None,
        )
    };

    let (status, body): (StatusCode, Value) = call(&app, list()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(call(&app, via(CURRENT, list())).await.0, StatusCode::OK);
    Ok(())
}

/// In AWS the functions read EDGE_ORIGIN_SECRET_ARN at a cold start: the current value and,
/// after a rotation, the previous one, until EDGE_ORIGIN_PREVIOUS_SECS after the current one
/// was made; a previous value already past that is not taken at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_origin_secret_and_its_previous_value_are_read_from_secrets_manager(
) -> anyhow::Result<()> {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url("http://127.0.0.1:4566")
        .load()
        .await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let name = format!("edge-origin-{}", uuid::Uuid::new_v4().simple());
    let created = client
        .create_secret()
        .name(&name)
        .secret_string(r#"{"value": "first-value"}"#)
        .send()
        .await?;
    let arn = created.arn().unwrap().to_string();
    let mut origin = EdgeOrigin {
        secret_arn: Some(arn.clone()),
        ..EdgeOrigin::default()
    };
    origin.resolve(&client).await?;
    let values = |o: &EdgeOrigin| {
        use seckill_shared::infra::secret::ExposeSecret;
        o.accepted()
            .iter()
            .map(|s| s.value.expose_secret().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(values(&origin), vec!["first-value"]);

    client
        .put_secret_value()
        .secret_id(&arn)
        .secret_string(r#"{"value": "second-value"}"#)
        .send()
        .await?;
    origin.resolve(&client).await?;
    assert_eq!(values(&origin), vec!["second-value", "first-value"]);
    let until = origin.from_arn[1].until.expect("the previous value ends");
    let left = until - Utc::now();
    assert!(
        left > ChronoDuration::hours(23) && left <= ChronoDuration::hours(24),
        "the previous value ends a day after the current one was made, not {left}"
    );
    assert!(
        origin.from_arn[0].until.is_none(),
        "the current value has no end"
    );

    origin.previous_for = std::time::Duration::ZERO;
    origin.resolve(&client).await?;
    assert_eq!(
        values(&origin),
        vec!["second-value"],
        "past its time: not taken"
    );
    Ok(())
}
