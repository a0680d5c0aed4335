//! A sale loaded into Redis, and loaded again after Redis lost it: buyable at once when created
//! inside the preheat lead, its state answered while not loaded, its buyers rebuilt, and no
//! reservation, cancel or click of before the reload counted twice.

use crate::{joined, within, world, World};
use axum::http::StatusCode;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::CancelOutcome;
use seckill_shared::protocol::consume::Decision;
use seckill_shared::store::keys::SENTINEL;
use seckill_shared::store::meta;
use seckill_shared::store::view;
use std::collections::BTreeSet;
use std::time::Duration;
use testkit::call;
use testkit::invariants::verdict;
use testkit::on_every_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;

on_every_redis!(
    a_sale_created_inside_the_preheat_lead_is_buyable_at_once,
    a_published_sale_not_in_redis_answers_its_state_never_404,
    reloading_a_lost_running_sale_rebuilds_its_buyers,
    a_reservation_lost_with_redis_is_not_committed_after_the_reload,
    a_cancel_during_a_reload_waits_for_it,
    a_reload_of_a_lost_sale_while_buyers_click_lets_no_buyer_buy_again,
);

/// A sale created a minute before its start must not wait for the preheat schedule.
async fn a_sale_created_inside_the_preheat_lead_is_buyable_at_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let now = Utc::now();
    let state = env.admin_state();
    let created = admin::create_activity(
        &state,
        &testkit::new_activity()
            .title("flash")
            .stock(5)
            .limit(1)
            .window(
                now - ChronoDuration::seconds(1),
                now + ChronoDuration::hours(1),
            )
            .build(),
    )
    .await?;
    let w = World::new(env, created);
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    Ok(())
}

/// A published sale that preheat has not loaded yet (or whose keys expired) answers as its
/// window says: 409 `not_started` / `ended`, or 503 while it runs; never 404.
async fn a_published_sale_not_in_redis_answers_its_state_never_404(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let now = Utc::now();
    let mut cases = Vec::new();
    let (day, conflict, unavailable) = (
        ChronoDuration::days(1),
        StatusCode::CONFLICT,
        StatusCode::SERVICE_UNAVAILABLE,
    );
    #[rustfmt::skip]
    let windows = [
        (now + day * 2, now + day * 3, conflict, "not_started"),
        (now - day * 3, now - day * 2, conflict, "ended"),
        (now - ChronoDuration::minutes(1), now + ChronoDuration::hours(1), unavailable, "unavailable"),
    ];
    for (start, end, status, code) in windows {
        let a = activity::insert(
            &env.pool,
            &testkit::new_activity()
                .title("not loaded")
                .stock(5)
                .limit(1)
                .window(start, end)
                .build()
                .settings()?,
        )
        .await?;
        cases.push((a, status, code));
    }
    let app = env.entry_router();
    for (a, status, code) in cases {
        let path = format!("/activities/{}/orders", a.id);
        let (got, body) = call(&app, request("POST", &path, Some(("alice", "")), None)).await;
        assert_eq!(
            (got, body["error"].as_str()),
            (status, Some(code)),
            "{body}"
        );
    }
    let (got, body) = call(
        &app,
        request(
            "POST",
            "/activities/999999/orders",
            Some(("alice", "")),
            None,
        ),
    )
    .await;
    assert_eq!(
        (got, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    Ok(())
}

/// Redis lost a running sale (a restart with no data). Loading it again must bring back who
/// already bought, or they buy again in Redis and only the database's index refuses them,
/// after a 202.
async fn reloading_a_lost_running_sale_rebuilds_its_buyers(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    w.confirmed("alice", 1).await?;
    w.confirmed("bob", 2).await?;
    w.unload().await?;

    w.preheat().run(Utc::now()).await?;
    assert_eq!(
        w.users().await?,
        BTreeSet::from(["alice".to_string(), "bob".to_string()])
    );
    let (_, body) = w.buy("alice", 1).await;
    assert_eq!(body["error"], "already_purchased", "{body}");

    // Reconcile's reload of a running sale does the same.
    w.unload().await?;
    w.reconcile().run(Utc::now()).await?;
    let (_, body) = w.buy("bob", 1).await;
    assert_eq!(body["error"], "already_purchased", "{body}");
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(7));
    w.assert_conserved().await
}

/// The consumer read alice's `r` entry and is about to write. Redis loses the sale; reconcile
/// reloads it: stock = DB remaining (10, alice's unit included, since it is not committed),
/// users = live holders (not alice). Were the consumer to commit now, the unit would count
/// twice (Redis 10, DB 9) and alice would hold an order outside the set. The reload's new load
/// epoch makes the commit fail: the reservation ends `reservation_expired`.
async fn a_reservation_lost_with_redis_is_not_committed_after_the_reload(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let message = w.pending("alice", 1).await?;

    let paused = pause::arm("consumer.before_write", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let late = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("the consumer's ledger check", paused.reached()).await?;
    w.unload().await?;
    let report = w.reconcile().run(Utc::now()).await?;
    assert!(report.activity(w.id()).is_some_and(|r| r.preheated));
    paused.resume();
    let processed = joined("the consumer", late).await?;

    let mut broken = Vec::new();
    if processed.decision == Decision::Committed {
        broken.push("the consumer committed a reservation Redis no longer held".into());
    }
    broken.extend(w.violations().await?);
    let alice_holds = w.holders().await?.contains("alice");
    let (status, body) = w.buy("alice", 1).await;
    let mut accepted = 0;
    if status == StatusCode::ACCEPTED {
        accepted += 1;
        if alice_holds {
            broken.push(format!("alice holds an order and got a second 202: {body}"));
        }
    }
    // Ten other buyers for the nine units the database has left.
    for i in 0..10 {
        if w.buy(&format!("u{i}"), 1).await.0 == StatusCode::ACCEPTED {
            accepted += 1;
        }
    }
    let remaining = w.db_row().await?.remaining_stock;
    if accepted > remaining {
        broken.push(format!(
            "{accepted} buyers told 202 after the reload for {remaining} units the database had"
        ));
    }
    verdict(broken)
}

/// The same from the cancel side: a load read the row (remaining 9); a cancel that committed
/// in the database alone now (the sale is not loaded) would be lost to Redis when the load
/// writes stock 9. A running sale missing from Redis takes no cancel until it is reloaded.
/// (Pause point `preheat.before_load` sits between the load's read and its write.)
async fn a_cancel_during_a_reload_waits_for_it(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 1).await?;
    w.unload().await?;

    // Preheat reloads it (reconcile's reload would fix the stock in the same run while the
    // ledger is still empty; with any traffic it cannot, as shown below).
    let paused = pause::arm("preheat.before_load", w.id());
    let preheat = w.preheat();
    let reload = tokio::spawn(async move { preheat.run(Utc::now()).await });
    within("the reload's read", paused.reached()).await?;
    let outcome = cancel::cancel_order(
        &w.env.login(Function::Entry).0,
        &w.env.login(Function::Entry).1,
        &bought,
        Utc::now(),
    )
    .await?;
    paused.resume();
    joined("the reload", reload).await?;

    let mut broken = w.violations().await?;
    // A running sale missing from Redis takes no cancel in the database alone: retried after
    // the reload, it goes through both.
    if outcome != CancelOutcome::Busy {
        broken.push(format!("a cancel during the reload answered {outcome:?}"));
    }
    let retried = w.cancel(bought.id).await?;
    if retried != (CancelOutcome::Cancelled { quantity: 1 }) {
        broken.push(format!("the retried cancel answered {retried:?}"));
    }
    broken.extend(w.violations().await?);
    broken.extend(w.drift_under_traffic().await?);
    verdict(broken)
}

/// Redis lost a running sale; preheat reloads it (rebuilds `users` from the live orders, then
/// loads the meta) while buyers keep clicking. Nobody who bought gets a 202 again, everyone
/// else gets at most one, and `users` and the ledger come back with their sentinel fields
/// and the sale's expiry; a sale that lost its sentinels gets them back on the next preheat.
async fn a_reload_of_a_lost_sale_while_buyers_click_lets_no_buyer_buy_again(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 20).await?;
    w.confirmed("alice", 1).await?;
    w.confirmed("bob", 2).await?;
    w.unload().await?;

    let paused = pause::arm("preheat.before_load", w.id());
    let preheat = w.preheat();
    let reload = tokio::spawn(async move { preheat.run(Utc::now()).await });
    within("the reload's read", paused.reached()).await?;
    let loaded = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut buyers = Vec::new();
    for user in ["alice", "bob", "carol", "dave"] {
        let (app, loaded) = (w.app.clone(), loaded.clone());
        let path = format!("/activities/{}/orders", w.id());
        buyers.push(tokio::spawn(async move {
            let (mut accepted, mut after_load) = (0, 0);
            while after_load < 5 {
                if loaded.load(std::sync::atomic::Ordering::SeqCst) {
                    after_load += 1;
                }
                let (status, _) = call(&app, request("POST", &path, Some((user, "")), None)).await;
                accepted += usize::from(status == StatusCode::ACCEPTED);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (user, accepted)
        }));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    paused.resume();
    joined("the reload", reload).await?;
    loaded.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut accepted = Vec::new();
    for buyer in buyers {
        accepted.push(within("a buyer", buyer).await??);
    }

    assert_eq!(
        accepted,
        vec![("alice", 0), ("bob", 0), ("carol", 1), ("dave", 1)]
    );
    let keys = w.env.redis.keys(w.id());
    let expire_at = w.db_row().await?.expire_at(w.env.config.expiry_buffer);
    for key in [&keys.users, &keys.ledger] {
        let sentinel: bool = w
            .env
            .redis
            .cmd(redis::cmd("HEXISTS").arg(key).arg(SENTINEL))
            .await?;
        let at: i64 = w.env.redis.cmd(redis::cmd("PEXPIRETIME").arg(key)).await?;
        assert!(sentinel, "{key} has no sentinel");
        assert_eq!(at, expire_at.timestamp_millis(), "{key}");
    }
    w.assert_conserved().await?;

    let _: i64 = w
        .env
        .redis
        .cmd(redis::cmd("HDEL").arg(&keys.users).arg(SENTINEL))
        .await?;
    let _: i64 = w
        .env
        .redis
        .cmd(redis::cmd("HDEL").arg(&keys.ledger).arg(SENTINEL))
        .await?;
    w.preheat().run(Utc::now()).await?;
    assert!(meta::has_sentinels(&w.env.redis, w.id()).await?);
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(15));
    w.assert_conserved().await
}
