//! A sale's rules of admission: the per-user purchase rate (429 and nothing changed; attempts
//! counted, not deliveries nor the draw's retry), and the admin's rules of a draw, fixed once the
//! sale started.

use axum::http::StatusCode;
use futures::StreamExt;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::domain::settings::DEFAULT_RATE_PER_SEC;
use seckill_shared::store;
use testkit::call;
use testkit::on_every_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{buy, call_with_headers, close_draw_window, order_rows, snapshot};
use uuid::Uuid;

on_every_redis!(
    only_a_sale_of_one_bucket_first_come_is_sold_out_from_its_stock_alone,
    the_rate_counts_attempts_not_deliveries_nor_the_draw_retry,
    the_admission_rules_are_checked_and_fixed_once_the_sale_started,
    attempts_past_the_per_user_rate_are_429_and_change_nothing,
);

/// purchase.lua answers sold out from the meta's read alone only for a sale of one bucket,
/// first come, first served. A draw sale emptied by its draw answers a loser
/// `already_purchased`, as before, never `sold_out`; a bucketed sale whose buyer's home bucket
/// is empty sells her a unit from another bucket.
async fn only_a_sale_of_one_bucket_first_come_is_sold_out_from_its_stock_alone(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    // Three buckets of one unit each; two buyers of bucket 0 (home of the first unit's buyer
    // and then of a second buyer whose home bucket is empty).
    let bucketed = env.open_activity_in_buckets(3, 1, 3).await?;
    let home = |user: &str| store::keys::Bucket::home(bucketed.id, 3, user).index;
    let mut users = (0..).map(|i| format!("u{i}")).filter(|u| home(u) == 0);
    let app = env.entry_router();
    for user in [users.next().unwrap(), users.next().unwrap()] {
        let (status, body) = testkit::buy(&app, &bucketed, &user, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{user} of bucket 0: {body}");
    }

    // A draw of one unit, two entrants: one wins it. The other, asking again, is told she
    // is in (already_purchased) as before, not sold out from the stock alone. (The winner
    // asking again is told sold out, by the stock check of the whole script, as before.)
    let d = env.draw_activity(1, 1).await?;
    for user in ["alice", "bob"] {
        let app = env.entry_router();
        assert_eq!(
            testkit::buy(&app, &d, user, None).await.0,
            StatusCode::ACCEPTED
        );
    }
    close_draw_window(&env, d.id).await;
    assert!(
        store::draw::draw(&env.redis, d.id, std::time::Duration::ZERO)
            .await?
            .is_done(),
        "one step draws both"
    );
    let snap = snapshot(&env, d.id).await;
    assert_eq!(snap.stock, Some(0), "the one unit was won");
    let winner = &snap
        .ledger
        .first()
        .expect("the winner's reservation")
        .user_id;
    let loser = if winner == "alice" { "bob" } else { "alice" };
    // A router of its own: no sold-out memory of another answer.
    let (status, body) = testkit::buy(&env.entry_router(), &d, loser, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased")),
        "{loser}, who lost the draw, asks again: {body}"
    );
    Ok(())
}

/// A user firing 50 attempts within a second at a sale limited to 5 per user and second: the
/// first buys, the next 4 are `already_purchased`, the other 45 are 429 `rate_limited` with
/// `Retry-After`, and nothing of theirs reaches Redis's stock, users or ledger, the queue or
/// the database. A second user is unaffected. With no rate set, nobody is limited.
async fn attempts_past_the_per_user_rate_are_429_and_change_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let new = |rate: Option<i64>| {
        testkit::new_activity()
            .title("rate")
            .stock(100)
            .limit(1)
            .rate_of(rate)
            .build()
    };
    let a = env.load_new(&new(Some(5))).await?;

    let path = format!("/activities/{}/orders", a.id);
    let answers = futures::stream::iter(0..50)
        .map(|_| call_with_headers(&app, request("POST", &path, Some(("mallory", "")), None)))
        .buffer_unordered(50)
        .collect::<Vec<_>>()
        .await;
    let count = |code: StatusCode| answers.iter().filter(|(s, _, _)| *s == code).count();
    assert_eq!(count(StatusCode::ACCEPTED), 1);
    assert_eq!(count(StatusCode::CONFLICT), 4);
    assert_eq!(count(StatusCode::TOO_MANY_REQUESTS), 45);
    for (status, headers, body) in &answers {
        if *status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(body["error"], "rate_limited", "{body}");
            assert_eq!(headers["retry-after"], "1");
        }
    }
    let snap = snapshot(&env, a.id).await;
    assert_eq!(
        (snap.stock, snap.participants, snap.ledger.len()),
        (Some(99), 1, 1)
    );
    assert_eq!(env.drain_messages(100).await?.len(), 1);

    let (status, _) = buy(&app, &a, "trent", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "another user is not limited");
    assert!(
        order_rows(&env, a.id).await.is_empty(),
        "nothing reached the database"
    );

    // A sale that names no rate has the default one; only a rate of 0 set on purpose is none.
    let limited = |rate: Option<i64>| {
        let app = app.clone();
        let new = new(rate);
        let env = &env;
        async move {
            let b = env.load_new(&new).await.unwrap();
            let path = format!("/activities/{}/orders", b.id);
            let answers = futures::stream::iter(0..50)
                .map(|_| call(&app, request("POST", &path, Some(("mallory", "")), None)))
                .buffer_unordered(50)
                .collect::<Vec<_>>()
                .await;
            answers
                .iter()
                .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
                .count()
        }
    };
    // Within one second all but the rate's worth; across a second's edge, two seconds' worth.
    let rate = DEFAULT_RATE_PER_SEC as usize;
    let refused = limited(None).await;
    assert!(
        (50 - 2 * rate..=50 - rate).contains(&refused),
        "{refused} refused"
    );
    assert_eq!(limited(Some(0)).await, 0);
    Ok(())
}

/// The admin side: a draw needs a window that fits the sale and one bucket, a window belongs
/// to a draw only, the admission is fixed once the sale started (409), and a rate changed on a
/// running sale reaches its purchase script at once.
async fn the_admission_rules_are_checked_and_fixed_once_the_sale_started(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let admin = env.admin_router();
    let ops = Some(("ops", "seckill:admin"));
    let now = chrono::Utc::now();
    let body = |extra: &str| {
        format!(
            r#"{{"title": "t", "totalStock": 5, "perOrderLimit": 1, "priceMinor": 1999, "currency": "usd", "startAt": "{}",
                "endAt": "{}"{extra}}}"#,
            (now + chrono::Duration::hours(1)).to_rfc3339(),
            (now + chrono::Duration::hours(2)).to_rfc3339()
        )
    };
    for (extra, why) in [
        (r#", "admission": "draw""#, "a draw without a window"),
        (
            r#", "admission": "draw", "drawWindowMs": 0"#,
            "an empty window",
        ),
        (r#", "drawWindowMs": 2000"#, "a window on a first-come sale"),
        (
            r#", "admission": "lottery", "drawWindowMs": 2000"#,
            "an unknown admission",
        ),
        (
            r#", "admission": "draw", "drawWindowMs": 2000, "buckets": 3"#,
            "a draw in buckets",
        ),
        (r#", "perUserRatePerSec": -1"#, "a negative rate"),
        (r#", "perUserRatePerSec": 1001"#, "a rate past the bound"),
    ] {
        let (status, answer) = call(
            &admin,
            request("POST", "/admin/activities", ops, Some(&body(extra))),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{why}: {answer}");
    }
    let (status, _) = call(
        &admin,
        request(
            "POST",
            "/admin/activities",
            ops,
            Some(&body(
                r#", "admission": "draw", "drawWindowMs": 2000, "perUserRatePerSec": 3"#,
            )),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);

    let a = env.draw_activity(5, 1).await?;
    let path = format!("/admin/activities/{}", a.id);
    for change in [r#"{"admission": "fcfs"}"#, r#"{"drawWindowMs": 1000}"#] {
        let (status, answer) = call(&admin, request("PUT", &path, ops, Some(change))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{change}: {answer}");
    }
    let (status, answer) = call(
        &admin,
        request("PUT", &path, ops, Some(r#"{"perUserRatePerSec": 2}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let k = env.redis.keys(a.id);
    let rate: Option<i64> = env
        .redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("rate"))
        .await?;
    assert_eq!(rate, Some(2));
    let draw_end: Option<i64> = env
        .redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawEndMs"))
        .await?;
    assert_eq!(
        draw_end,
        Some(a.draw_end_ms()),
        "the change kept the draw's window"
    );
    Ok(())
}

/// The per-user rate counts attempts, not deliveries: the same script delivered twice past
/// the rate answers as its first run did, and a buyer after a draw window told `draw_running`
/// while the drawer has not run (again and again) is counted once, when the purchase runs.
async fn the_rate_counts_attempts_not_deliveries_nor_the_draw_retry(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(5, 1).await?;
    let path = format!("/admin/activities/{}", a.id);
    let admin = env.admin_router();
    let ops = Some(("ops", "seckill:admin"));
    let body = r#"{"perUserRatePerSec": 1}"#;
    assert_eq!(
        call(&admin, request("PUT", &path, ops, Some(body))).await.0,
        StatusCode::OK
    );

    let request_id = Uuid::now_v7();
    for _ in 0..2 {
        let attempt = Attempt {
            request_id,
            activity_id: a.id,
            user_id: "alice".into(),
            quantity: 1,
            buckets: 1,
        };
        let deadline = store::purchase::far_deadline();
        let (decision, _) =
            store::purchase::run(&env.redis, a.id.into(), &attempt, deadline, &[]).await?;
        assert_eq!(decision, store::purchase::Answer::Queued { rank: 1 });
    }
    close_draw_window(&env, a.id).await;
    // Told to come again while the draw is due: not an attempt, however often.
    for _ in 0..3 {
        let (status, body) = buy(&app, &a, "bob", None).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::CONFLICT, Some("draw_running")),
            "{body}"
        );
    }
    env.reconcile().run(chrono::Utc::now()).await?;
    let (status, body) = buy(&app, &a, "bob", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("pending")),
        "{body}"
    );
    let (status, body) = buy(&app, &a, "carol", None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, body) = buy(&app, &a, "carol", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited"))
    );
    Ok(())
}
