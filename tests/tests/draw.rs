//! Draw admission against real Redis (standalone and cluster), PostgreSQL and the SQS
//! emulator: the pool and its one entry per user, the draw's fairness against first come,
//! first served, a crash between the draw and the sends, reconcile against a late send, the
//! stock the pool left, and the per-user purchase rate.

use axum::http::StatusCode;
use axum::Router;
use futures::StreamExt;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::domain::settings::DEFAULT_RATE_PER_SEC;
use seckill_shared::infra::pause;
use seckill_shared::protocol::purchase::{self, Outcome};
use seckill_shared::store;
use seckill_shared::store::draw;
use seckill_shared::store::draw::Drawn;
use seckill_shared::store::view;
use testkit::invariants;
use testkit::on_both_redis;

use seckill_shared::Refusal;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use testkit::call;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

use testkit::{
    after_grace, age_reservations, buy, call_with_headers, close_draw_window, consume_queue,
    draw_entry_rows, my_status, order_rows, snapshot,
};

/// One attempt as the entry makes it, without HTTP: for the crowds of the fairness test.
async fn enter(env: &TestEnv, activity_id: i64, user: &str) -> Outcome {
    let mut buy = Attempt {
        request_id: Uuid::now_v7(),
        activity_id,
        user_id: user.to_string(),
        quantity: 1,
        buckets: 1,
    };
    purchase::enter(
        &env.redis,
        &purchase::Hints::none(),
        &mut buy,
        store::purchase::far_deadline(),
    )
    .await
    .expect("redis answers")
}

const ENTRANTS: usize = 2_000;
const STOCK: i64 = 200;
/// Rank bins of the chi-square test, and its critical value at p = 0.001 for 9 degrees of
/// freedom.
const BINS: usize = 10;
const CHI2_CRITICAL: f64 = 27.877;

/// Pearson's chi-square of the winners' arrival ranks (1..=ENTRANTS) over equal bins.
fn chi_square(ranks: &[i64]) -> f64 {
    let mut counts = [0f64; BINS];
    for &r in ranks {
        counts[((r - 1) as usize * BINS) / ENTRANTS] += 1.0;
    }
    let expected = ranks.len() as f64 / BINS as f64;
    counts
        .iter()
        .map(|c| (c - expected).powi(2) / expected)
        .sum()
}

/// A draw sale of STOCK units with ENTRANTS entrants, arriving one after the other: the arrival
/// rank of each winner after its draw (each sale has its own ticket secret).
async fn winners_of_a_draw(env: &TestEnv) -> anyhow::Result<Vec<i64>> {
    let a = env.draw_sale(STOCK, 1).await?;
    for i in 0..ENTRANTS {
        let entered = enter(env, a.id, &format!("u{i}")).await;
        assert_eq!(entered, Outcome::Queued { rank: i as i64 + 1 });
    }
    close_draw_window(env, a.id).await;
    let drawn = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert_eq!(
        drawn,
        Drawn::Now {
            winners: STOCK,
            units: STOCK,
            entrants: ENTRANTS as i64
        }
    );
    let pool = draw::pool(&env.redis, a.id).await?;
    let mut ranks: Vec<i64> = pool
        .iter()
        .filter(|(_, e)| e.won)
        .map(|(_, e)| e.rank)
        .collect();
    ranks.sort();
    assert_eq!(ranks.len() as i64, STOCK);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    Ok(ranks)
}

/// 2,000 entrants in a known arrival order for 200 units. First come, first served: the
/// first 200 arrivals win, and the chi-square of their ranks is far past any critical value.
/// A draw: the winners' ranks pass the chi-square test, and over 20 sales (20 secrets) the
/// mean winning rank and the early arrivals' share of the wins are what chance gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_draw_gives_no_advantage_to_early_arrivals_where_first_come_gives_them_all() {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();

    let fcfs = env.open_sale(STOCK, 1).await.unwrap();
    let mut fcfs_ranks = Vec::new();
    for i in 0..ENTRANTS {
        match enter(&env, fcfs.id, &format!("u{i}")).await {
            Outcome::Reserved(_) => fcfs_ranks.push(i as i64 + 1),
            Outcome::Refused(Refusal::SoldOut { .. }) => {}
            other => panic!("first come, first served answered {other:?}"),
        }
    }
    assert_eq!(fcfs_ranks, (1..=STOCK).collect::<Vec<_>>());
    let fcfs_chi2 = chi_square(&fcfs_ranks);
    assert!(fcfs_chi2 > 1_000.0, "first come: chi-square {fcfs_chi2}");

    let ranks = winners_of_a_draw(&env).await.unwrap();
    let chi2 = chi_square(&ranks);
    assert!(
        chi2 < CHI2_CRITICAL,
        "draw: chi-square {chi2} over {ranks:?}"
    );

    // Twenty draws: 4,000 winning ranks. Uniform ranks 1..=2000 have mean 1000.5 and standard
    // deviation 577.35; drawn without replacement (200 of 2,000 per sale) the mean of 4,000
    // has a standard error of 577.35 * sqrt(1800/1999) / sqrt(4000) = 8.66. The first tenth
    // of the arrivals wins a tenth of the draws: 400 of 4,000, standard error sqrt(360) = 19.
    let draws = futures::stream::iter(1..=20u32)
        .map(|_| winners_of_a_draw(&env))
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
    let all: Vec<i64> = draws.into_iter().flat_map(|d| d.unwrap()).collect();
    assert_eq!(all.len(), 4_000);
    let mean = all.iter().sum::<i64>() as f64 / all.len() as f64;
    assert!(
        (mean - 1000.5).abs() < 4.0 * 8.66,
        "mean winning rank {mean}"
    );
    let early = all.iter().filter(|&&r| r <= 200).count() as f64;
    println!(
        "first come: chi-square {fcfs_chi2:.0}; one draw: chi-square {chi2:.2} \
         (critical {CHI2_CRITICAL}); 20 draws: mean winning rank {mean:.1} (1000.5), \
         first tenth won {early} of 4000 (400)"
    );
    assert!(
        (early - 400.0).abs() < 4.0 * 19.0,
        "early arrivals won {early} of 4000"
    );
}

/// The pool: one entry per user (a second attempt is `already_purchased`, the same request
/// run twice is `queued` again), a wrong quantity refused as ever, no stock taken. After
/// the window: a queued user asking for their status runs the draw; with fewer entrants than
/// units every entrant wins and the rest is sold first come, first served; the draw run again
/// changes nothing.
async fn the_pool_takes_one_entry_per_user_and_what_it_leaves_is_sold_first_come(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(10, 2).await?;

    let (status, body) = buy(&app, &a, "alice", Some(r#"{"quantity": 2}"#)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased"))
    );
    let (status, body) = buy(&app, &a, "bob", Some(r#"{"quantity": 3}"#)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("quantity_exceeds_limit"))
    );
    assert_eq!(buy(&app, &a, "carol", None).await.0, StatusCode::ACCEPTED);
    assert_eq!(my_status(&app, &a, "alice").await, "queued");
    assert_eq!(my_status(&app, &a, "bob").await, "none");
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), 2);
    assert_eq!(
        view::stock(&env.redis, a.id).await?,
        Some(10),
        "the pool takes no stock"
    );
    assert_eq!(
        consume_queue(&env).await?,
        0,
        "no order message before the draw (the entries' are kept)"
    );
    assert_eq!(
        draw_entry_rows(&env, a.id).await,
        2,
        "each entry is kept once"
    );

    close_draw_window(&env, a.id).await;
    // Alice asks first: that runs the draw, and she is a winner (3 of 10 units asked).
    assert_eq!(my_status(&app, &a, "alice").await, "pending");
    assert_eq!(my_status(&app, &a, "carol").await, "pending");
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(7));
    assert_eq!(consume_queue(&env).await?, 2);
    assert_eq!(my_status(&app, &a, "alice").await, "confirmed");

    // The 7 left go first come, first served; an entrant cannot buy again.
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased"))
    );
    let (status, body) = buy(&app, &a, "bob", Some(r#"{"quantity": 2}"#)).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("pending")),
        "{body}"
    );
    assert_eq!(consume_queue(&env).await?, 1);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(5));

    let before = snapshot(&env, a.id).await;
    assert_eq!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Before { entrants: 2 }
    );
    assert_eq!(snapshot(&env, a.id).await, before);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// More entrants than units: the losers read `not_drawn`, final (their purchase after the
/// draw is refused), the winners get their orders. The first purchase after the window runs
/// the draw and is itself served first come, first served.
async fn losers_read_not_drawn_and_the_first_purchase_after_the_window_runs_the_draw(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(3, 1).await?;
    let users: Vec<String> = (0..8).map(|i| format!("entrant-{i}")).collect();
    for u in &users {
        assert_eq!(buy(&app, &a, u, None).await.0, StatusCode::ACCEPTED);
    }
    close_draw_window(&env, a.id).await;
    let (status, body) = buy(&app, &a, "late", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out")),
        "{body}"
    );
    assert_eq!(consume_queue(&env).await?, 3);
    let mut statuses = Vec::new();
    for u in &users {
        statuses.push(my_status(&app, &a, u).await);
    }
    assert_eq!(
        statuses.iter().filter(|s| *s == "confirmed").count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| *s == "not_drawn").count(),
        5,
        "{statuses:?}"
    );
    let loser = &users[statuses.iter().position(|s| s == "not_drawn").unwrap()];
    let (status, body) = buy(&app, &a, loser, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased"))
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A crash after the draw, before its sends (the entry that ran it dies): the outbox keeps
/// the winners, and reconcile, run once the draw's reservations are past the grace period,
/// sends them instead of giving their units back. Every winner gets an order; the units
/// balance.
async fn every_winner_gets_an_order_after_a_crash_between_the_draw_and_the_sends(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(5, 1).await?;
    for i in 0..8 {
        assert_eq!(
            buy(&app, &a, &format!("e{i}"), None).await.0,
            StatusCode::ACCEPTED
        );
    }
    close_draw_window(&env, a.id).await;
    let crash = pause::arm_failure("entry.draw.before_send", a.id, 1);
    assert_eq!(buy(&app, &a, "late", None).await.0, StatusCode::CONFLICT);
    assert_eq!(crash.hits(), 1, "the draw ran and its sends were skipped");
    assert_eq!(consume_queue(&env).await?, 0, "no winner sent");
    assert_eq!(draw::unsent(&env.redis, a.id).await?, 5);

    let grace = env.config.reconcile_grace;
    age_reservations(&env, a.id, grace + Duration::from_secs(60)).await;
    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!((r.winners_sent, r.compensated), (5, 0), "{r:?}");
    assert_eq!(draw::unsent(&env.redis, a.id).await?, 0);
    assert_eq!(consume_queue(&env).await?, 5);
    let confirmed = order_rows(&env, a.id).await;
    assert_eq!(
        confirmed.iter().filter(|o| o.status == "confirmed").count(),
        5
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A drainer paused between taking its batch (the reservations restamped) and sending it,
/// while reconcile runs past the grace period of the draw: reconcile finds the lease held
/// and the winners in the outbox, and gives back nothing. The drainer then sends, and every
/// winner is confirmed.
async fn reconcile_gives_back_nothing_of_a_draw_whose_sends_are_late(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(4, 1).await?;
    for i in 0..6 {
        assert_eq!(
            buy(&app, &a, &format!("e{i}"), None).await.0,
            StatusCode::ACCEPTED
        );
    }
    close_draw_window(&env, a.id).await;
    let paused = pause::arm("draw.drain.after_take", a.id);
    let late = {
        let app = app.clone();
        let a = a.clone();
        tokio::spawn(async move { buy(&app, &a, "late", None).await })
    };
    assert!(
        paused.reached_within(Duration::from_secs(10)).await,
        "the drainer took its batch"
    );

    let report = env
        .reconcile()
        .run(after_grace(env.config.reconcile_grace))
        .await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!((r.compensated, r.winners_sent), (0, 0), "{r:?}");
    assert_eq!(
        snapshot(&env, a.id).await.pending_count(),
        4,
        "the winners keep their units"
    );

    paused.resume();
    let (status, _) = late.await?;
    assert_eq!(status, StatusCode::CONFLICT, "4 units, 4 winners: sold out");
    assert_eq!(consume_queue(&env).await?, 4);
    let rows = order_rows(&env, a.id).await;
    assert_eq!(
        rows.iter().filter(|o| o.status == "confirmed").count(),
        4,
        "{rows:?}"
    );
    invariants::check(&env, a.id).await?;
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
        testkit::sale()
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

    let a = env.draw_sale(5, 1).await?;
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

/// A queued user asking for their status reads their entry `q`, and pauses; another buyer
/// runs the draw meanwhile and the user wins. The answer is the winner's `pending`, never
/// `not_drawn`, which is final.
async fn a_status_read_across_the_draw_answers_what_the_draw_decided(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(5, 1).await?;
    assert_eq!(buy(&app, &a, "alice", None).await.0, StatusCode::ACCEPTED);
    close_draw_window(&env, a.id).await;
    let paused = pause::arm("entry.my_order.after_pool_read", a.id);
    let asking = {
        let (app, a) = (app.clone(), a.clone());
        tokio::spawn(async move { my_status(&app, &a, "alice").await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    let (status, body) = buy(&app, &a, "bob", None).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "bob buys first come after the draw: {body}"
    );
    assert!(
        draw::pool_entry(&env.redis, a.id, "alice")
            .await?
            .unwrap()
            .won
    );
    paused.resume();
    assert_eq!(asking.await?, "pending");
    Ok(())
}

/// A purchase in the draw window whose answer is lost: the 503 takes the entry out of the
/// pool, so the user's retry is queued (not `already_purchased`) and the draw never sees the
/// request told nothing happened. An entry whose give-back never reached Redis (only the
/// database's claim was made) is taken out by reconcile before it draws.
async fn a_draw_entry_answered_503_leaves_the_pool(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(5, 1).await?;
    let lost = pause::arm_failure("entry.purchase.reply_lost", a.id, 1);
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(lost.hits(), 1);
    assert_eq!(draw::pool_entry(&env.redis, a.id, "alice").await?, None);
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued"))
    );

    // Bob's purchase ran, and only the claim of its 503 got through.
    let bob = testkit::reserve_in_pool(&env, a.id, "bob").await;
    seckill_shared::protocol::giveback::claim(&env.pool, &bob, "unavailable").await?;
    close_draw_window(&env, a.id).await;
    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!((r.pool_left, r.drawn), (1, true), "{r:?}");
    let pool = draw::pool(&env.redis, a.id).await?;
    assert_eq!(
        pool.iter()
            .map(|(u, e)| (u.as_str(), e.won))
            .collect::<Vec<_>>(),
        [("alice", true)]
    );
    Ok(())
}

/// A purchase in the draw window whose answer is lost while the database is out of reach too:
/// no claim can be made, and the 503 still takes the entry out of the pool, so no draw picks
/// a request told nothing happened. The user's retry (the database back) is queued.
async fn a_draw_entry_answered_503_with_the_database_down_leaves_the_pool(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_sale(5, 1).await?;
    let dead = env.entry_router_with(|c| c.pool = testkit::dead_pool());
    let lost = pause::arm_failure("entry.purchase.reply_lost", a.id, 1);
    let (status, body) = buy(&dead, &a, "alice", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(lost.hits(), 1);
    assert_eq!(draw::pool_entry(&env.redis, a.id, "alice").await?, None);
    assert!(order_rows(&env, a.id).await.is_empty(), "no claim was made");
    let (status, body) = buy(&env.entry_router(), &a, "alice", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    Ok(())
}

/// The clean-up of purchases answered 503 is incremental: each run reads the claims after the
/// cursor in the sale's meta and moves it past the ones older than a minute, so a claim is
/// handled once; a younger one (a row id taken before an older one committed could still
/// appear below it) holds the cursor and is read again until it is old enough.
async fn the_503_clean_up_reads_each_claim_once(kind: RedisKind) -> anyhow::Result<()> {
    use seckill_shared::protocol::draw::leave_unanswered;
    let env = TestEnv::new(kind).await?;
    let a = env.draw_sale(5, 1).await?;
    let mut claims = Vec::new();
    for user in ["u1", "u2", "u3", "u4"] {
        let entry = testkit::reserve_in_pool(&env, a.id, user).await;
        seckill_shared::protocol::giveback::claim(&env.pool, &entry, "unavailable").await?;
        let id: i64 = sqlx::query_scalar("select id from orders where request_id = $1")
            .bind(entry.request_id)
            .fetch_one(&env.pool)
            .await?;
        claims.push(id);
    }
    // All but u3's claim are two minutes old.
    sqlx::query("update orders set created_at = now() - interval '2 minutes' where id = any($1)")
        .bind([claims[0], claims[1], claims[3]].to_vec())
        .execute(&env.pool)
        .await?;

    assert_eq!(leave_unanswered(&env.redis, &env.pool, a.id).await?, 4);
    assert_eq!(draw::left_after(&env.redis, a.id).await?, claims[1]);
    // Read again from u3's claim on: nothing left to leave, the cursor held by u3.
    assert_eq!(leave_unanswered(&env.redis, &env.pool, a.id).await?, 0);
    assert_eq!(draw::left_after(&env.redis, a.id).await?, claims[1]);
    sqlx::query("update orders set created_at = now() - interval '2 minutes' where id = $1")
        .bind(claims[2])
        .execute(&env.pool)
        .await?;
    assert_eq!(leave_unanswered(&env.redis, &env.pool, a.id).await?, 0);
    assert_eq!(draw::left_after(&env.redis, a.id).await?, claims[3]);
    for user in ["u1", "u2", "u3", "u4"] {
        assert_eq!(
            draw::pool_entry(&env.redis, a.id, user).await?,
            None,
            "{user}"
        );
    }
    Ok(())
}

/// A draw sale's pool takes `maxEntrants` entrants: the next is refused 409 `pool_full` and
/// nothing is written (no pool entry, no ticket, no rank); an entrant already in it is still
/// `queued` on a retry, and one whose entry left after a 503 may come back. The admin API
/// refuses a maxEntrants out of bounds, and a raise lets the next entrant in.
async fn a_full_pool_refuses_the_next_entrant_and_changes_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let now = chrono::Utc::now();
    let new = |max_entrants: i64| {
        testkit::sale()
            .title("small pool")
            .stock(2)
            .limit(1)
            .window(
                now - chrono::Duration::seconds(1),
                now + chrono::Duration::hours(1),
            )
            .draw(600_000)
            .rate(0)
            .max_entrants(max_entrants)
            .build()
    };
    for bad in [0, -1, 10_000_001] {
        let e = new(bad).settings().unwrap_err();
        assert!(e.0.contains("maxEntrants"), "{e}");
    }
    let a = env.load_new(&new(3)).await?;
    let mut first = None;
    for user in ["u1", "u2", "u3"] {
        let (status, body) = buy(&app, &a, user, None).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::ACCEPTED, Some("queued"))
        );
        first.get_or_insert(body["requestId"].as_str().unwrap().parse::<Uuid>()?);
    }
    let before = (
        draw::pool(&env.redis, a.id).await?.len(),
        tickets(&env, a.id).await.len(),
    );
    let (status, body) = buy(&app, &a, "u4", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("pool_full")),
        "{body}"
    );
    assert_eq!(
        (
            draw::pool(&env.redis, a.id).await?.len(),
            tickets(&env, a.id).await.len()
        ),
        before
    );
    assert!(draw::pool_entry(&env.redis, a.id, "u4").await?.is_none());
    // An entrant in the pool is answered as before; one taken back comes back.
    let (status, _) = buy(&app, &a, "u2", None).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a second entry is already_purchased"
    );
    assert!(draw::leave(&env.redis, a.id, "u1", first.unwrap()).await?);
    let (status, body) = buy(&app, &a, "u1", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued"))
    );
    // Out of bounds through the admin API: 400, nothing changed. A raise reaches Redis with
    // the admin's change.
    let admin = env.admin_router();
    let ops = Some(("ops", "seckill:admin"));
    let path = format!("/admin/activities/{}", a.id);
    let (status, body) = call(
        &admin,
        request("PUT", &path, ops, Some(r#"{"maxEntrants": 0}"#)),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request")),
        "{body}"
    );
    let (status, body) = call(
        &admin,
        request("PUT", &path, ops, Some(r#"{"maxEntrants": 4}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["maxEntrants"], 4, "{body}");
    let (status, body) = buy(&app, &a, "u4", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    Ok(())
}

/// Once a draw step ran the pool is closed, even should the server's clock go back before the
/// window's end (a failover to a replica whose clock is behind): an entry then would land
/// below the cursor and never be looked at. The purchase is told `draw_due` and writes nothing.
async fn no_entry_after_the_first_draw_step_whatever_the_clock(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_sale(2 * draw::STEP_TICKETS as i64, 1).await?;
    for i in 0..3 * draw::STEP_TICKETS {
        enter(&env, a.id, &format!("e{i}")).await;
    }
    close_draw_window(&env, a.id).await;
    let first = draw::draw(&env.redis, a.id, Duration::ZERO).await?;
    assert!(matches!(first, Drawn::Running { .. }), "{first:?}");
    // The clock "goes back": the window's end lies ahead again.
    let k = env.redis.keys(a.id);
    let ahead = chrono::Utc::now().timestamp_millis() + 600_000;
    let _: () = env
        .redis
        .cmd(redis::cmd("HSET").arg(&k.meta).arg("drawEndMs").arg(ahead))
        .await?;
    assert_eq!(enter(&env, a.id, "late").await, Outcome::DrawDue);
    assert!(!tickets(&env, a.id).await.contains_key("late"));
    assert!(draw::pool_entry(&env.redis, a.id, "late").await?.is_none());
    Ok(())
}

/// A drawn sale whose meta Redis lost is reloaded from the database with its draw's state
/// gone too (pool, tickets, outbox): the draw cannot run a second time over the old entries,
/// and no loser told `not_drawn` becomes a winner.
async fn a_sale_reloaded_after_its_draw_draws_nobody_again(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_sale(2, 1).await?;
    for i in 0..10 {
        enter(&env, a.id, &format!("e{i}")).await;
    }
    close_draw_window(&env, a.id).await;
    assert!(draw::draw(&env.redis, a.id, Duration::MAX).await?.is_done());
    let losers: Vec<String> = draw::pool(&env.redis, a.id)
        .await?
        .into_iter()
        .filter(|(_, e)| !e.won)
        .map(|(u, _)| u)
        .collect();
    assert_eq!(losers.len(), 8);

    testkit::lose_sale(&env.redis, a.id).await?;
    seckill_shared::protocol::load::load_under_lock(&env.redis, &env.pool, &env.config, a.id)
        .await?;
    assert!(draw::pool(&env.redis, a.id).await?.is_empty());
    assert!(tickets(&env, a.id).await.is_empty());
    close_draw_window(&env, a.id).await;
    let again = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert_eq!(
        again,
        Drawn::Now {
            winners: 0,
            units: 0,
            entrants: 0
        }
    );
    for loser in &losers {
        assert!(draw::pool_entry(&env.redis, a.id, loser)
            .await?
            .is_none_or(|e| !e.won));
    }
    Ok(())
}

/// A purchase whose answer is lost in the last moment of the window is claimed for its 503,
/// and pauses before its Redis half; the window closes and another buyer draws, picking the
/// entry. Resumed, the give-back returns the winner's unit: the 503 holds nothing, the unit is
/// sold again, and no order is made of the request.
async fn a_draw_between_a_503s_claim_and_its_give_back_holds_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(1, 1).await?;
    let _lost = pause::arm_failure("entry.purchase.reply_lost", a.id, 1);
    let paused = pause::arm("entry.unanswered.after_claim", a.id);
    let alice = {
        let (app, a) = (app.clone(), a.clone());
        tokio::spawn(async move { buy(&app, &a, "alice", None).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    close_draw_window(&env, a.id).await;
    assert_eq!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Now {
            winners: 1,
            units: 1,
            entrants: 1
        }
    );
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    paused.resume();
    let (status, _) = alice.await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        view::stock(&env.redis, a.id).await?,
        Some(1),
        "the unit is back"
    );
    assert_eq!(snapshot(&env, a.id).await.pending_count(), 0);
    let (status, body) = buy(&app, &a, "bob", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("pending"))
    );
    consume_queue(&env).await?;
    let rows = order_rows(&env, a.id).await;
    assert!(
        rows.iter()
            .all(|o| o.user_id != "alice" || o.status == "failed"),
        "{rows:?}"
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// The per-user rate counts attempts, not deliveries: the same script delivered twice past
/// the rate answers as its first run did, and the first buyer after a draw window (told to
/// run the draw, then asking again) is counted once.
async fn the_rate_counts_attempts_not_deliveries_nor_the_draw_retry(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(5, 1).await?;
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

/// Each entrant's ticket as `scripts/draw_verify.py` recomputes it from the revealed secret,
/// after checking the secret against the commitment (it exits non-zero on a mismatch).
fn verified_tickets(secret: &str, commitment: &str, users: &[String]) -> HashMap<String, i64> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/draw_verify.py"))
        .args(["--secret", secret, "--commitment", commitment, "--json"])
        .args(users)
        .output()
        .expect("python3 runs scripts/draw_verify.py");
    assert!(
        out.status.success(),
        "the verifier refused: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the verifier's JSON")
}

/// Every ticket in the sale's `tickets`, by user (the sentinel left out).
async fn tickets(env: &TestEnv, activity_id: i64) -> HashMap<String, i64> {
    let k = env.redis.keys(activity_id);
    let flat: Vec<(String, f64)> = env
        .redis
        .cmd(
            redis::cmd("ZRANGE")
                .arg(&k.tickets)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        )
        .await
        .unwrap();
    flat.into_iter()
        .filter(|(user, _)| !user.is_empty())
        .map(|(user, score)| (user, score as i64))
        .collect()
}

/// The public view's `draw`.
async fn public_draw(app: &Router, a: &Activity) -> Value {
    let (status, body) = call(
        app,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["draw"].clone()
}

/// The draw is verifiable: from its creation the public view shows the SHA-256 of the ticket
/// secret and nothing else of it; after the draw it shows the secret and the cutoff, and the
/// verifier recomputes from them every entrant's ticket as Redis holds it, and the winners
/// are exactly the entrants with the lowest tickets, each at or below the cutoff, every
/// loser above it.
async fn the_revealed_secret_reproduces_every_ticket_and_the_winners_through_the_verifier(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_sale(40, 1).await?;
    let before = public_draw(&app, &a).await;
    let commitment = before["commitment"]
        .as_str()
        .expect("a commitment")
        .to_string();
    assert_eq!(commitment.len(), 64, "{before}");
    assert!(
        before.get("secret").is_none() && before.get("cutoff").is_none(),
        "{before}"
    );

    let users: Vec<String> = (0..300).map(|i| format!("entrant-{i}")).collect();
    for (i, user) in users.iter().enumerate() {
        assert_eq!(
            enter(&env, a.id, user).await,
            Outcome::Queued { rank: i as i64 + 1 }
        );
    }
    let held = tickets(&env, a.id).await;
    assert_eq!(held.len(), users.len());
    // Before the draw the view still hides the secret, also with the window closed.
    close_draw_window(&env, a.id).await;
    assert!(public_draw(&app, &a).await.get("secret").is_none());

    let drawn = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert_eq!(
        drawn,
        Drawn::Now {
            winners: 40,
            units: 40,
            entrants: 300
        }
    );
    // The view caches for up to 250 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = public_draw(&app, &a).await;
    assert_eq!(after["commitment"], before["commitment"], "{after}");
    let secret = after["secret"]
        .as_str()
        .expect("the secret, revealed")
        .to_string();
    let cutoff = after["cutoff"].as_i64().expect("the cutoff");

    let verified = verified_tickets(&secret, &commitment, &users);
    assert_eq!(
        verified, held,
        "the verifier's tickets are the ones Redis drew with"
    );
    let mut by_ticket: Vec<(&i64, &String)> = verified.iter().map(|(u, t)| (t, u)).collect();
    by_ticket.sort();
    let lowest: HashSet<&String> = by_ticket.iter().take(40).map(|(_, u)| *u).collect();
    let won: HashSet<&String> = draw::pool(&env.redis, a.id)
        .await?
        .iter()
        .filter(|(_, e)| e.won)
        .filter_map(|(user, _)| users.iter().find(|u| *u == user))
        .collect();
    assert_eq!(won, lowest, "the winners are the 40 lowest tickets");
    for (user, t) in &verified {
        assert_eq!(
            *t <= cutoff,
            won.contains(user),
            "{user}: ticket {t}, cutoff {cutoff}"
        );
    }
    // A wrong secret is caught by the commitment.
    let wrong = "00".repeat(32);
    let out = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/draw_verify.py"))
        .args(["--secret", &wrong, "--commitment", &commitment, "alice"])
        .output()?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

/// A ticket is the user's, not the attempt's: an entry answered 503 and taken back out of the
/// pool, then made again (a new request), gets the same ticket; so does the same user in
/// another attempt. A retry cannot improve the odds.
async fn a_re_entry_after_a_503_keeps_its_ticket(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_sale(5, 1).await?;
    let first = Uuid::now_v7();
    let mut attempt = Attempt {
        request_id: first,
        activity_id: a.id,
        user_id: "alice".into(),
        quantity: 1,
        buckets: 1,
    };
    purchase::enter(
        &env.redis,
        &purchase::Hints::none(),
        &mut attempt,
        store::purchase::far_deadline(),
    )
    .await?;
    let ticket = tickets(&env, a.id).await["alice"];
    assert!(draw::leave(&env.redis, a.id, "alice", first).await?);
    assert!(draw::pool_entry(&env.redis, a.id, "alice").await?.is_none());
    for _ in 0..3 {
        assert!(matches!(
            enter(&env, a.id, "alice").await,
            Outcome::Queued { .. } | Outcome::Refused(Refusal::AlreadyPurchased)
        ));
        assert_eq!(tickets(&env, a.id).await["alice"], ticket);
    }
    // Another sale, another secret: another ticket (2^-52 to be equal by chance).
    let b = env.draw_sale(5, 1).await?;
    enter(&env, b.id, "alice").await;
    assert_ne!(tickets(&env, b.id).await["alice"], ticket);
    Ok(())
}

/// The draw runs in steps of at most `STEP_TICKETS` tickets, each atomic, from a cursor in
/// Redis. A purchase that finds the draw due runs it and is paused between its first two
/// steps while others act: a direct purchase is told `draw_due` and changes nothing, an entry
/// beyond the cursor is taken back (a 503's clean-up). Held past its budget, the purchase
/// answers 409 `draw_running` with `Retry-After: 1` and reserves nothing; the rest of the draw
/// runs in the background and in the test's own call at once. The winners are exactly the
/// lowest tickets of the entries still in the pool, as many as the stock.
async fn the_draw_runs_in_bounded_steps_that_others_run_between(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let entrants = 3 * draw::STEP_TICKETS + 17;
    // Stock for more than one step's tickets: the draw needs several steps.
    let stock = (2 * draw::STEP_TICKETS) as i64;
    let a = env.draw_sale(stock, 1).await?;
    let users: Vec<String> = (0..entrants).map(|i| format!("e{i:04}")).collect();
    for user in &users {
        assert!(matches!(
            enter(&env, a.id, user).await,
            Outcome::Queued { .. }
        ));
    }
    close_draw_window(&env, a.id).await;
    let mut order: Vec<(i64, String)> = tickets(&env, a.id)
        .await
        .into_iter()
        .map(|(u, t)| (t, u))
        .collect();
    order.sort();

    let paused = pause::arm("draw.between_steps", a.id);
    let latecomer = {
        let app = app.clone();
        let path = format!("/activities/{}/orders", a.id);
        tokio::spawn(async move {
            call_with_headers(&app, request("POST", &path, Some(("latecomer", "")), None)).await
        })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    let k = env.redis.keys(a.id);
    let at: i64 = env
        .redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawAt"))
        .await?;
    assert_eq!(
        at,
        1 + draw::STEP_TICKETS as i64,
        "one step looked at STEP_TICKETS tickets"
    );
    let stock_between = view::stock(&env.redis, a.id).await?;
    assert_eq!(stock_between, Some(stock - draw::STEP_TICKETS as i64));

    assert_eq!(enter(&env, a.id, "another").await, Outcome::DrawDue);
    let taken_back = &order[draw::STEP_TICKETS + 5].1;
    let entry = draw::pool_entry(&env.redis, a.id, taken_back)
        .await?
        .unwrap();
    assert!(draw::leave(&env.redis, a.id, taken_back, entry.request_id).await?);
    assert_eq!(view::stock(&env.redis, a.id).await?, stock_between);
    // Past the purchase's budget for the draw.
    tokio::time::sleep(Duration::from_millis(400)).await;
    paused.resume();

    let (status, headers, body) = latecomer.await?;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("draw_running")),
        "{body}"
    );
    assert_eq!(
        headers.get("retry-after").map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let rest = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert!(rest.is_done(), "{rest:?}");
    let won: HashSet<String> = draw::pool(&env.redis, a.id)
        .await?
        .into_iter()
        .filter(|(_, e)| e.won)
        .map(|(u, _)| u)
        .collect();
    let want: HashSet<String> = order
        .iter()
        .map(|(_, u)| u.clone())
        .filter(|u| u != taken_back)
        .take(stock as usize)
        .collect();
    assert_eq!(won, want);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    invariants::check(&env, a.id).await?;
    Ok(())
}

on_both_redis!(
    the_revealed_secret_reproduces_every_ticket_and_the_winners_through_the_verifier,
    a_re_entry_after_a_503_keeps_its_ticket,
    the_draw_runs_in_bounded_steps_that_others_run_between,
    a_draw_between_a_503s_claim_and_its_give_back_holds_nothing,
    a_status_read_across_the_draw_answers_what_the_draw_decided,
    a_draw_entry_answered_503_leaves_the_pool,
    a_draw_entry_answered_503_with_the_database_down_leaves_the_pool,
    the_503_clean_up_reads_each_claim_once,
    a_full_pool_refuses_the_next_entrant_and_changes_nothing,
    no_entry_after_the_first_draw_step_whatever_the_clock,
    a_sale_reloaded_after_its_draw_draws_nobody_again,
    the_rate_counts_attempts_not_deliveries_nor_the_draw_retry,
    the_admission_rules_are_checked_and_fixed_once_the_sale_started,
    the_pool_takes_one_entry_per_user_and_what_it_leaves_is_sold_first_come,
    losers_read_not_drawn_and_the_first_purchase_after_the_window_runs_the_draw,
    every_winner_gets_an_order_after_a_crash_between_the_draw_and_the_sends,
    reconcile_gives_back_nothing_of_a_draw_whose_sends_are_late,
    attempts_past_the_per_user_rate_are_429_and_change_nothing,
);
