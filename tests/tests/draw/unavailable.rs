//! A draw entry answered 503 (its reply lost, the database down): it leaves the pool, the clean-up
//! reads each claim once, a draw between the claim and the give-back holds nothing, and the user's
//! retry keeps her ticket.

use crate::enter;
use crate::fairness::tickets;
use axum::http::StatusCode;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::purchase::{self, Outcome};
use seckill_shared::store;
use seckill_shared::store::draw;
use seckill_shared::store::draw::Drawn;
use seckill_shared::store::view;
use seckill_shared::Refusal;
use std::time::Duration;
use testkit::invariants;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;
use testkit::{buy, close_draw_window, consume_queue, order_rows, snapshot};
use uuid::Uuid;

on_every_redis!(
    a_re_entry_after_a_503_keeps_its_ticket,
    a_draw_between_a_503s_claim_and_its_give_back_holds_nothing,
    a_draw_entry_answered_503_leaves_the_pool,
    a_draw_entry_answered_503_with_the_database_down_leaves_the_pool,
    the_503_clean_up_reads_each_claim_once,
);

/// A purchase in the draw window whose answer is lost: the 503 takes the entry out of the
/// pool, so the user's retry is queued (not `already_purchased`) and the draw never sees the
/// request told nothing happened. An entry whose give-back never reached Redis (only the
/// database's claim was made) is taken out by reconcile before it draws.
async fn a_draw_entry_answered_503_leaves_the_pool(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(5, 1).await?;
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
    seckill_shared::protocol::giveback::claim(
        &env.login(Function::Entry).0,
        &bob,
        FailureReason::Unavailable,
    )
    .await?;
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
    let a = env.draw_activity(5, 1).await?;
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
    let a = env.draw_activity(5, 1).await?;
    let mut claims = Vec::new();
    for user in ["u1", "u2", "u3", "u4"] {
        let entry = testkit::reserve_in_pool(&env, a.id, user).await;
        seckill_shared::protocol::giveback::claim(
            &env.login(Function::Entry).0,
            &entry,
            FailureReason::Unavailable,
        )
        .await?;
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

    assert_eq!(
        leave_unanswered(&env.redis, &env.pool, a.id, testkit::a_minute_from_now()).await?,
        4
    );
    assert_eq!(draw::left_after(&env.redis, a.id).await?, claims[1]);
    // Read again from u3's claim on: nothing left to leave, the cursor held by u3.
    assert_eq!(
        leave_unanswered(&env.redis, &env.pool, a.id, testkit::a_minute_from_now()).await?,
        0
    );
    assert_eq!(draw::left_after(&env.redis, a.id).await?, claims[1]);
    sqlx::query("update orders set created_at = now() - interval '2 minutes' where id = $1")
        .bind(claims[2])
        .execute(&env.pool)
        .await?;
    assert_eq!(
        leave_unanswered(&env.redis, &env.pool, a.id, testkit::a_minute_from_now()).await?,
        0
    );
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

/// A purchase whose answer is lost in the last moment of the window is claimed for its 503,
/// and pauses before its Redis half; the window closes and another buyer draws, picking the
/// entry. Resumed, the give-back returns the winner's unit: the 503 holds nothing, the unit is
/// sold again, and no order is made of the request.
async fn a_draw_between_a_503s_claim_and_its_give_back_holds_nothing(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(1, 1).await?;
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
            .all(|o| o.user_id != "alice" || o.status == OrderStatus::Failed),
        "{rows:?}"
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A ticket is the user's, not the attempt's: an entry answered 503 and taken back out of the
/// pool, then made again (a new request), gets the same ticket; so does the same user in
/// another attempt. A retry cannot improve the odds.
async fn a_re_entry_after_a_503_keeps_its_ticket(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_activity(5, 1).await?;
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
        &seckill_shared::protocol::buckets::Hints::none(),
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
    let b = env.draw_activity(5, 1).await?;
    enter(&env, b.id, "alice").await;
    assert_ne!(tickets(&env, b.id).await["alice"], ticket);
    Ok(())
}
