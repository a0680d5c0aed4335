//! The pool rebuilt from the database's entries after a loss: reconcile finishes a rebuild a load
//! left, a user who entered again during it goes back once, an entry answered 503 is never put
//! back, an entry kept during a reload is in the pool once, and the draw waits for a rebuild
//! between its chunks.

use crate::{entrants, lose_and_reload, lowest_tickets, winners_in_pool};
use axum::http::StatusCode;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::purchase::{Attempt, MessageKind, OrderMessage};
use seckill_shared::domain::status::{FailureReason, OrderStatus};
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::draw as drawing;
use seckill_shared::store::draw::{self, Drawn};
use std::sync::Arc;
use std::time::Duration;
use testkit::on_every_redis;
use testkit::{buy, close_draw_window, consume_queue, draw_entry_rows, my_status, order_rows};
use testkit::{RedisKind, TestEnv};

on_every_redis!(
    an_entry_answered_503_is_never_put_back,
    an_entry_kept_during_a_reload_is_in_the_pool_once,
    the_draw_waits_for_a_rebuild_between_its_chunks,
    reconcile_finishes_a_rebuild_a_load_left,
    a_user_who_entered_again_during_a_rebuild_goes_back_once,
);

/// A load's rebuild stops between two chunks (out of its time, or the loader died): the draw
/// waits, and reconcile's next run finishes the rebuild before it runs the draw.
async fn reconcile_finishes_a_rebuild_a_load_left(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let a = env.draw_activity(5, 1).await?;
    let n = drawing::REBUILD_CHUNK + 50;
    let users = keep_entries(&env, &a, n).await;
    let cut = pause::arm_failure("draw.rebuild.between_chunks", a.id, 1);
    lose_and_reload(&env, &a).await;
    assert_eq!(cut.hits(), 1);
    assert_eq!(
        draw::pool(&env.redis, a.id).await?.len(),
        drawing::REBUILD_CHUNK
    );
    close_draw_window(&env, a.id).await;
    assert!(matches!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Restoring { .. }
    ));

    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert_eq!(r.pool_rebuilt, 50, "{r:?}");
    assert!(r.drawn, "the draw ran after the rebuild: {r:?}");
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), n);
    assert_eq!(
        winners_in_pool(&env, &a).await,
        lowest_tickets(&env, &a, &users, 5).await
    );
    Ok(())
}

/// A user whose kept entry is not put back yet (the rebuild paused before her chunk) enters
/// again and is queued with a new request. Both are kept; only the newer goes back at the next
/// load from scratch, and it is the one in the pool.
async fn a_user_who_entered_again_during_a_rebuild_goes_back_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(kind).await?);
    let app = env.entry_router();
    let a = env.draw_activity(5, 1).await?;
    let users = keep_entries(&env, &a, drawing::REBUILD_CHUNK + 50).await;
    let late = users.last().unwrap().clone();
    let paused = pause::arm("draw.rebuild.between_chunks", a.id);
    let loading = {
        let (env, a) = (env.clone(), a.clone());
        tokio::spawn(async move { lose_and_reload(&env, &a).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    let (status, body) = buy(&app, &a, &late, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    let again: uuid::Uuid = body["requestId"].as_str().unwrap().parse()?;
    consume_queue(&env).await?;
    paused.resume();
    loading.await?;
    let entry = draw::pool_entry(&env.redis, a.id, &late).await?.unwrap();
    assert_eq!(entry.request_id, again);

    lose_and_reload(&env, &a).await;
    let entry = draw::pool_entry(&env.redis, a.id, &late).await?.unwrap();
    assert_eq!(
        entry.request_id, again,
        "her newer entry is the one put back"
    );
    let kept = seckill_shared::domain::draw::entries_after(&env.pool, a.id, 0, 10_000).await?;
    assert_eq!(
        kept.iter()
            .filter(|e| e.live && e.entry.user_id == late)
            .count(),
        1,
        "one live entry per user goes back"
    );
    Ok(())
}

/// `n` entries kept in the database as the consumer writes them, without the crowd's HTTP:
/// users `u0..`.
async fn keep_entries(env: &TestEnv, a: &Activity, n: usize) -> Vec<String> {
    let users: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    sqlx::query(
        "insert into draw_entries (activity_id, user_id, request_id, quantity)
         select $1, u, gen_random_uuid(), 1 from unnest($2::text[]) as u",
    )
    .bind(a.id)
    .bind(&users)
    .execute(&env.pool)
    .await
    .unwrap();
    users
}

/// An entry whose send fails is claimed and taken out of the pool before its 503; its message,
/// stored after all (a send that timed out), is read by the consumer and kept nowhere, and the
/// pool's tombstone keeps the consumer from putting it back. The user enters again and is
/// queued, with the same ticket.
async fn an_entry_answered_503_is_never_put_back(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let failed = pause::arm_failure("entry.enter.send", a.id, 1);
    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(failed.hits(), 1);
    assert_eq!(draw::pool_entry(&env.redis, a.id, "alice").await?, None);
    let claimed = order_rows(&env, a.id).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        (claimed[0].status, claimed[0].failure_reason),
        (OrderStatus::Failed, Some(FailureReason::Unavailable))
    );

    // The message the failed send stored after all.
    let stored = OrderMessage {
        attempt: Attempt {
            request_id: claimed[0].request_id,
            activity_id: a.id,
            user_id: "alice".into(),
            quantity: 1,
            buckets: 1,
        },
        reserved_at_ms: 0,
        load_epoch: None,
        kind: MessageKind::Entry,
    };
    env.consumer().handle_message(&stored).await?;
    assert_eq!(
        draw_entry_rows(&env, a.id).await,
        0,
        "a claimed entry is not kept"
    );
    assert_eq!(draw::pool_entry(&env.redis, a.id, "alice").await?, None);

    let (status, body) = buy(&app, &a, "alice", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    assert_eq!(consume_queue(&env).await?, 0);
    assert_eq!(draw_entry_rows(&env, a.id).await, 1);
    Ok(())
}

/// The consumer keeps an entry and pauses before it makes sure of its pool entry; meanwhile
/// Redis loses the sale and the load puts the kept entry back. Resumed, the consumer adds
/// nothing twice: one pool entry, one ticket.
async fn an_entry_kept_during_a_reload_is_in_the_pool_once(kind: RedisKind) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(kind).await?);
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    entrants(&app, &a, "e", 1).await;
    let paused = pause::arm("consumer.entry.after_commit", a.id);
    let consuming = {
        let env = env.clone();
        tokio::spawn(async move { consume_queue(&env).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    lose_and_reload(&env, &a).await;
    let pool = draw::pool(&env.redis, a.id).await?;
    assert_eq!(pool.len(), 1, "{pool:?}");
    let rank = pool[0].1.rank;
    paused.resume();
    consuming.await??;
    let pool = draw::pool(&env.redis, a.id).await?;
    assert_eq!(pool.len(), 1, "{pool:?}");
    assert_eq!(pool[0].1.rank, rank, "not made again");
    Ok(())
}

/// A rebuild of many entries paused between two chunks: the draw waits for it (a purchase
/// after the window answers `draw_running`, an entrant from before the loss reads `queued`);
/// resumed, the rebuild finishes and the draw runs over every entry. The drawer's 503
/// clean-up meanwhile takes an old request of a user of the second chunk out of the pool (she
/// was answered 503 once, then entered again) and, the rebuild under way, does not put her kept
/// entry back itself (the rebuild does, as the database says): its tombstone does not keep her
/// entry out.
async fn the_draw_waits_for_a_rebuild_between_its_chunks(kind: RedisKind) -> anyhow::Result<()> {
    let env = Arc::new(TestEnv::new(kind).await?);
    let app = env.entry_router();
    let a = env.draw_activity(5, 1).await?;
    let n = drawing::REBUILD_CHUNK + 50;
    let users = keep_entries(&env, &a, n).await;
    let answered_503 = users.last().unwrap().clone();
    sqlx::query(
        "insert into orders (request_id, activity_id, user_id, quantity, status, failure_reason)
         values (gen_random_uuid(), $1, $2, 1, 'failed', 'unavailable')",
    )
    .bind(a.id)
    .bind(&answered_503)
    .execute(&env.pool)
    .await?;

    let paused = pause::arm("draw.rebuild.between_chunks", a.id);
    let loading = {
        let env = env.clone();
        let a = a.clone();
        tokio::spawn(async move { lose_and_reload(&env, &a).await })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    close_draw_window(&env, a.id).await;
    let (status, body) = buy(&app, &a, "late", None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("draw_running")),
        "{body}"
    );
    assert_eq!(my_status(&app, &a, "u0").await, "queued");
    // The drawer's clean-up of the 503 claims, before it would draw.
    let (db, redis) = env.login(Function::Reconcile);
    drawing::leave_unanswered(&redis, &db, a.id, testkit::a_minute_from_now()).await?;
    let k = env.redis.keys(a.id);
    let held: Option<String> = env
        .redis
        .cmd(redis::cmd("HGET").arg(&k.pool).arg(&answered_503))
        .await?;
    assert!(
        held.as_deref().is_some_and(|v| v.ends_with("|x")),
        "not yet put back, her old request's tombstone in its place: {held:?}"
    );
    assert!(matches!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Restoring { .. }
    ));
    paused.resume();
    loading.await?;
    close_draw_window(&env, a.id).await;
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), n);
    assert!(draw::pool_entry(&env.redis, a.id, &answered_503)
        .await?
        .is_some());
    let expected = lowest_tickets(&env, &a, &users, 5).await;
    // Reloaded after a loss: the drawer ends the wait for queued entries (none here) first.
    assert!(draw::draw_with(&env.redis, a.id, Duration::MAX, true)
        .await?
        .is_done());
    assert_eq!(winners_in_pool(&env, &a).await, expected);
    Ok(())
}
