//! The give-back protocol under interleavings that real concurrency hits only by luck.
//!
//! Each test stops one actor at a named pause point (`seckill_shared::infra::pause`) between two of
//! its steps, runs another actor to the end, resumes the first, and then checks what
//! `docs/invariants.md` promises: every unit has one fate, decided once by the database
//! (an order, or a `failed` row whose units went back to Redis exactly once), a 503 means
//! nothing was sold, and Redis stock written from outside the purchase and give-back scripts
//! never erases a move it did not see.

use axum::http::StatusCode;
use axum::Router;
use chrono::{Duration as ChronoDuration, Utc};
use order_consumer::{Consumer, Outcome};
use preheat::Preheat;
use reconcile::Reconcile;
use seckill_shared::domain::activity;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::order;
use seckill_shared::domain::order::Order;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::infra::pause;
use seckill_shared::protocol::cancel;
use seckill_shared::protocol::cancel::{CancelError, CancelOutcome};
use seckill_shared::protocol::lock;
use seckill_shared::store::keys::SENTINEL;
use seckill_shared::store::ledger;
use seckill_shared::store::meta;
use seckill_shared::store::view;
use testkit::on_both_redis;

use anyhow::Context as _;
use serde_json::Value;
use sqlx::Connection;
use std::collections::BTreeSet;
use std::time::Duration;
use testkit::call;
use testkit::invariants::{self, verdict, Books};
use testkit::request;
use testkit::PrivateRedis;
use testkit::RedisKind;
use testkit::TestEnv;
use uuid::Uuid;

on_both_redis!(
    a_late_second_cancel_gives_the_units_back_once,
    a_stale_cancel_resumed_after_another_finished_leaves_the_buyer_free_to_buy,
    a_cancel_never_takes_over_a_crashed_cancellers_entry,
    extending_a_running_sale_keeps_its_buyers_and_reservations_alive,
    a_send_that_times_out_after_storing_sells_nothing,
    a_send_that_times_out_after_the_consumer_committed_answers_202,
    reconcile_giving_back_a_late_reservation_beats_the_late_consumer,
    a_second_delivery_cannot_commit_what_the_first_gave_back,
    a_sale_created_inside_the_preheat_lead_is_buyable_at_once,
    a_published_sale_not_in_redis_answers_its_state_never_404,
    preheat_racing_an_admin_lower_loads_what_the_database_holds,
    stock_correction_skips_a_stock_that_moved_and_came_back,
    an_admin_commit_whose_reply_was_lost_is_not_reverted_in_redis,
    a_lower_that_never_committed_and_could_not_tell_is_healed_by_preheat,
    a_preheat_during_a_lower_never_undoes_its_meta,
    orphan_cleanup_never_drops_a_user_who_bought_again_meanwhile,
    reloading_a_lost_running_sale_rebuilds_its_buyers,
    a_purchase_reply_lost_to_a_timeout_is_given_back_at_once,
    a_slow_cancel_is_aborted_before_reconcile_drops_its_entry,
    a_reservation_lost_with_redis_is_not_committed_after_the_reload,
    a_cancel_during_a_reload_waits_for_it,
    the_stock_fix_never_undoes_an_admin_lower_whose_lease_ran_out,
    an_orphan_check_never_lets_a_user_buy_twice,
    a_reload_of_a_lost_sale_while_buyers_click_lets_no_buyer_buy_again,
    restoring_a_lost_field_never_races_a_cancel_of_the_order,
    restoring_a_lost_field_never_races_the_buyers_new_purchase,
    restoring_a_lost_field_never_races_a_reload_of_the_sale,
);

const GRACE: Duration = Duration::from_secs(5);

/// One sale and every actor that can touch it.
struct World {
    env: TestEnv,
    app: Router,
    sale: Activity,
}

async fn world(kind: RedisKind, stock: i64) -> anyhow::Result<World> {
    let mut env = TestEnv::new(kind).await?;
    env.config.reconcile_grace = GRACE;
    let sale = env.open_sale(stock, 5).await?;
    Ok(World::new(env, sale))
}

impl World {
    fn new(env: TestEnv, sale: Activity) -> Self {
        let app = env.entry_router();
        Self { env, app, sale }
    }

    fn id(&self) -> i64 {
        self.sale.id
    }

    fn consumer(&self) -> Consumer {
        self.env.consumer()
    }

    fn reconcile(&self) -> Reconcile {
        self.env.reconcile()
    }

    fn preheat(&self) -> Preheat {
        self.env.preheat()
    }

    fn admin(&self) -> admin::AdminState {
        self.env.admin_state()
    }

    /// A purchase through the entry router.
    async fn buy(&self, user: &str, qty: i64) -> (StatusCode, Value) {
        let body = format!(r#"{{"quantity":{qty}}}"#);
        let path = format!("/activities/{}/orders", self.id());
        call(
            &self.app,
            request("POST", &path, Some((user, "")), Some(&body)),
        )
        .await
    }

    /// The order messages on the queue, in order (they are received, not deleted).
    async fn messages(&self) -> anyhow::Result<Vec<OrderMessage>> {
        let mut out = Vec::new();
        for m in self.env.drain_messages(100).await? {
            out.push(serde_json::from_str(m.body().unwrap_or_default())?);
        }
        Ok(out)
    }

    /// An accepted purchase whose message is on the queue, not consumed.
    async fn pending(&self, user: &str, qty: i64) -> anyhow::Result<OrderMessage> {
        let (status, body) = self.buy(user, qty).await;
        anyhow::ensure!(status == StatusCode::ACCEPTED, "{user}: {status} {body}");
        let request_id: Uuid = body["requestId"].as_str().unwrap_or_default().parse()?;
        self.messages()
            .await?
            .into_iter()
            .find(|m| m.attempt.request_id == request_id)
            .ok_or_else(|| anyhow::anyhow!("message of {request_id} not on the queue"))
    }

    /// A purchase the consumer has confirmed (order row, DB stock, ledger entry dropped).
    async fn confirmed(&self, user: &str, qty: i64) -> anyhow::Result<Order> {
        let message = self.pending(user, qty).await?;
        let request_id = message.attempt.request_id;
        let done = self.consumer().handle_message(&message).await?;
        anyhow::ensure!(done.outcome == Outcome::Committed, "{done:?}");
        self.order_of(request_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no order for {request_id}"))
    }

    async fn order_of(&self, request_id: Uuid) -> anyhow::Result<Option<Order>> {
        Ok(order::by_request(&self.env.pool, request_id).await?)
    }

    /// A cancel of `order` (as read then), running on its own task.
    fn spawn_cancel(
        &self,
        order: &Order,
    ) -> tokio::task::JoinHandle<Result<CancelOutcome, CancelError>> {
        let (pool, redis, order) = (self.env.pool.clone(), self.env.redis.clone(), order.clone());
        tokio::spawn(async move { cancel::cancel_order(&pool, &redis, &order, Utc::now()).await })
    }

    async fn cancel(&self, order_id: i64) -> anyhow::Result<CancelOutcome> {
        let order = order::get(&self.env.pool, order_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no order {order_id}"))?;
        Ok(cancel::cancel_order(&self.env.pool, &self.env.redis, &order, Utc::now()).await?)
    }

    /// The users `users` holds (the sentinel field not counted).
    async fn users(&self) -> anyhow::Result<BTreeSet<String>> {
        let keys = self.env.redis.keys(self.id());
        let users: Vec<String> = self
            .env
            .redis
            .cmd(redis::cmd("HKEYS").arg(&keys.users))
            .await?;
        Ok(users.into_iter().filter(|u| u != SENTINEL).collect())
    }

    /// Users holding a live (confirmed or paid) order.
    async fn holders(&self) -> anyhow::Result<BTreeSet<String>> {
        let holders = order::live_holders(&self.env.pool, self.id()).await?;
        Ok(holders.into_iter().map(|(user, _)| user).collect())
    }

    /// A user in `users` with nothing behind them (no entry, no order): what a crash can leave.
    async fn orphan(&self, user: &str) -> anyhow::Result<()> {
        let keys = self.env.redis.keys(self.id());
        let _: i64 = self
            .env
            .redis
            .cmd(
                redis::cmd("HSET")
                    .arg(&keys.users)
                    .arg(user)
                    .arg(Uuid::new_v4().to_string()),
            )
            .await?;
        Ok(())
    }

    /// Drift by hand: Redis stock set behind every script's back.
    async fn set_stock(&self, stock: i64) -> anyhow::Result<()> {
        let keys = self.env.redis.keys(self.id());
        let _: i64 = self
            .env
            .redis
            .cmd(redis::cmd("HSET").arg(&keys.meta).arg("stock").arg(stock))
            .await?;
        Ok(())
    }

    /// Redis loses the sale, as after a restart with no data.
    async fn unload(&self) -> anyhow::Result<()> {
        testkit::lose_sale(&self.env.redis, self.id()).await
    }

    async fn db_row(&self) -> anyhow::Result<Activity> {
        activity::get(&self.env.pool, self.id())
            .await?
            .ok_or_else(|| anyhow::anyhow!("activity gone"))
    }

    /// With traffic (a young reservation) reconcile cannot correct the stock: whatever drift
    /// is left now stays for the rest of the sale.
    async fn drift_under_traffic(&self) -> anyhow::Result<Option<String>> {
        self.pending("bob", 1).await?;
        let report = self.reconcile().run(Utc::now()).await?;
        let r = report
            .activity(self.id())
            .ok_or_else(|| anyhow::anyhow!("not reconciled"))?;
        Ok((r.drift != 0).then(|| {
            format!(
                "next reconcile with traffic: {:?}, drift {} stays",
                r.stock_check, r.drift
            )
        }))
    }

    /// What docs/invariants.md promises of the sale at a quiet moment: the kit's checker.
    async fn assert_conserved(&self) -> anyhow::Result<()> {
        invariants::check(&self.env, self.id()).await
    }

    /// The kit's checker's violations, for a test that adds findings of its own.
    async fn violations(&self) -> anyhow::Result<Vec<String>> {
        let books = Books::read(&self.env.redis, &self.env.pool, self.id()).await?;
        Ok(books.violations().iter().map(ToString::to_string).collect())
    }
}

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not finish"))
}

/// Awaits a spawned actor and its result.
async fn joined<T, E: std::fmt::Debug>(
    what: &str,
    task: tokio::task::JoinHandle<Result<T, E>>,
) -> anyhow::Result<T> {
    within(what, task)
        .await??
        .map_err(|e| anyhow::anyhow!("{what} failed: {e:?}"))
}

/// Canceller B read the order as confirmed; canceller A then ran all three steps, the user
/// bought again, and only then B announces its cancel. B must not give the units back again
/// nor take the user out of the set while they hold the newer order.
async fn a_late_second_cancel_gives_the_units_back_once(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let first = w.confirmed("alice", 2).await?;

    let paused = pause::arm("cancel.before_begin", w.id());
    // B read the order as confirmed, before A's cancel.
    let b = w.spawn_cancel(&first);
    within("canceller B reaching its pause", paused.reached()).await?;

    assert_eq!(
        w.cancel(first.id).await?,
        CancelOutcome::Cancelled { quantity: 2 }
    );
    let second = w.confirmed("alice", 1).await?;
    paused.resume();
    let late = joined("canceller B", b).await?;

    assert_eq!(late, CancelOutcome::AlreadyCancelled);
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(9));
    assert!(
        w.users().await?.contains("alice"),
        "alice holds {}",
        second.id
    );
    w.assert_conserved().await
}

/// Canceller B read the order as confirmed and stops before announcing its cancel; canceller A
/// runs all three steps. When B goes on, Redis holds nothing for the order: B answers as a
/// repeated cancel and writes nothing, so the user A gave the quota back to is not put back in
/// `users` (where they would be refused as already_purchased) and can buy again.
async fn a_stale_cancel_resumed_after_another_finished_leaves_the_buyer_free_to_buy(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 2).await?;

    let paused = pause::arm("cancel.before_begin", w.id());
    let b = w.spawn_cancel(&bought);
    within("canceller B reaching its pause", paused.reached()).await?;
    assert_eq!(
        w.cancel(bought.id).await?,
        CancelOutcome::Cancelled { quantity: 2 }
    );
    paused.resume();
    let late = joined("canceller B", b).await?;

    assert_eq!(late, CancelOutcome::AlreadyCancelled);
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    assert!(
        !w.users().await?.contains("alice"),
        "the late cancel put alice back in users"
    );
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    w.assert_conserved().await
}

/// A canceller crashed after announcing its cancel. A second cancel of the same order must not
/// adopt that entry: reconcile, seeing it stale, drops it while the second one would still be
/// on its way, and the second one's units would then never reach Redis.
async fn a_cancel_never_takes_over_a_crashed_cancellers_entry(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 1).await?;

    // Canceller A announces, then dies before its database step.
    let crash = pause::arm("cancel.after_begin", w.id());
    let a = w.spawn_cancel(&bought);
    within("canceller A announcing", crash.reached()).await?;
    a.abort();
    let _ = a.await;
    drop(crash);

    // Canceller B stops after its own announcement; reconcile then runs past the grace.
    let paused = pause::arm("cancel.after_begin", w.id());
    let b = w.spawn_cancel(&bought);
    within("canceller B announcing", paused.reached()).await?;
    w.reconcile().run(testkit::after_grace(GRACE)).await?;
    paused.resume();
    let outcome = within("canceller B", b).await?;
    w.assert_conserved().await?;

    // Whatever B answered, a cancel now completes and gives the unit back exactly once.
    if matches!(outcome, Ok(Ok(CancelOutcome::Busy))) {
        assert_eq!(
            w.cancel(bought.id).await?,
            CancelOutcome::Cancelled { quantity: 1 }
        );
    }
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    w.assert_conserved().await
}

/// `PUT endAt` later must move the expiry of every key of the sale, `users` and the ledger
/// included: otherwise they vanish at the old end + buffer and earlier buyers may buy again.
async fn extending_a_running_sale_keeps_its_buyers_and_reservations_alive(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    w.confirmed("alice", 1).await?;
    let (status, _) = w.buy("bob", 1).await; // stays pending
    assert_eq!(status, StatusCode::ACCEPTED);

    let new_end = w.sale.end_at + ChronoDuration::hours(6);
    let patch = ActivityPatch {
        end_at: Some(new_end),
        ..ActivityPatch::default()
    };
    admin::update_activity(&w.admin(), w.id(), &patch).await?;

    let buffer = ChronoDuration::from_std(w.env.config.expiry_buffer)?;
    let must_live_ms = (new_end + buffer - Utc::now()).num_milliseconds() - 60_000;
    let keys = w.env.redis.keys(w.id());
    for key in [&keys.meta, &keys.users, &keys.ledger] {
        let ttl: i64 = w.env.redis.cmd(redis::cmd("PTTL").arg(key)).await?;
        assert!(
            ttl >= must_live_ms,
            "{key} expires in {ttl} ms, before the new end + buffer"
        );
    }
    Ok(())
}

/// The queue stored the message but the send timed out; the consumer passed every check before
/// the entry gave the reservation back. The caller is told 503: nothing may be sold.
async fn a_send_that_times_out_after_storing_sells_nothing(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let _lost = pause::arm_failure("queue.send.lost_reply", w.id(), 1);
    let entry_paused = pause::arm("entry.after_send_error", w.id());
    let app = w.app.clone();
    let path = format!("/activities/{}/orders", w.id());
    let entry =
        tokio::spawn(
            async move { call(&app, request("POST", &path, Some(("alice", "")), None)).await },
        );
    within("the entry's send", entry_paused.reached()).await?;

    let message = w.messages().await?.pop().expect("the stored message");
    let consumer_paused = pause::arm("consumer.before_write", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let consumer = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("the consumer's checks", consumer_paused.reached()).await?;

    entry_paused.resume();
    let (status, body) = within("the entry", entry).await??;
    consumer_paused.resume();
    joined("the consumer", consumer).await?;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let row = w.order_of(message.attempt.request_id).await?;
    assert!(
        row.as_ref().is_none_or(|o| o.status == "failed"),
        "the caller was told nothing was sold, yet {row:?}"
    );
    w.assert_conserved().await
}

/// The other order of the same race: the consumer committed before the entry learnt that its
/// send timed out. The database holds the order, so the caller gets 202, not a false 503.
async fn a_send_that_times_out_after_the_consumer_committed_answers_202(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let _lost = pause::arm_failure("queue.send.lost_reply", w.id(), 1);
    let entry_paused = pause::arm("entry.after_send_error", w.id());
    let app = w.app.clone();
    let path = format!("/activities/{}/orders", w.id());
    let entry =
        tokio::spawn(
            async move { call(&app, request("POST", &path, Some(("alice", "")), None)).await },
        );
    within("the entry's send", entry_paused.reached()).await?;
    let message = w.messages().await?.pop().expect("the stored message");
    w.consumer().handle_message(&message).await?;
    entry_paused.resume();
    let (status, body) = within("the entry", entry).await??;

    let row = w.order_of(message.attempt.request_id).await?;
    let sold = row.as_ref().is_some_and(|o| o.status == "confirmed");
    let answered = if sold {
        StatusCode::ACCEPTED
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    assert_eq!(status, answered, "{body} with {row:?}");
    assert!(sold, "the consumer ran first: {row:?}");
    w.assert_conserved().await
}

/// Reconcile gives a reservation back after the grace period while its (late) message sits
/// in a consumer that already passed its checks. Only one of the two may win.
async fn reconcile_giving_back_a_late_reservation_beats_the_late_consumer(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let (status, _) = w.buy("alice", 2).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let message = w.messages().await?.pop().expect("the message");

    let paused = pause::arm("consumer.before_write", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let late = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("the consumer's checks", paused.reached()).await?;
    let report = w.reconcile().run(testkit::after_grace(GRACE)).await?;
    paused.resume();
    let processed = joined("the consumer", late).await?;

    let row = w.order_of(message.attempt.request_id).await?;
    let given_back = report.activity(w.id()).map_or(0, |r| r.compensated);
    assert!(
        (given_back == 1) != row.as_ref().is_some_and(|o| o.status == "confirmed"),
        "reconcile gave back {given_back} and the consumer made {processed:?} / {row:?}"
    );
    w.assert_conserved().await
}

/// Delivery 2 passed its checks; delivery 1 hit sold-out in the database and gave the units
/// back; a cancel then freed database stock; delivery 2 goes on. It must not commit.
async fn a_second_delivery_cannot_commit_what_the_first_gave_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bob = w.confirmed("bob", 1).await?;
    let (status, _) = w.buy("alice", 1).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let message = w.messages().await?.pop().expect("alice's message");
    // The database has no stock left for alice (as after an admin lower in between).
    testkit::set_db_stock(&w.env, w.id(), 0).await;

    let second_paused = pause::arm("consumer.before_write", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let second = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("delivery 2's checks", second_paused.reached()).await?;

    let first_paused = pause::arm("consumer.after_give_back", w.id());
    let consumer = w.consumer();
    let m = message.clone();
    let first = tokio::spawn(async move { consumer.handle_message(&m).await });
    within("delivery 1's give-back", first_paused.reached()).await?;

    assert_eq!(
        w.cancel(bob.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    second_paused.resume();
    joined("delivery 2", second).await?;
    first_paused.resume();
    joined("delivery 1", first).await?;

    let row = w.order_of(message.attempt.request_id).await?;
    assert_eq!(row.map(|o| o.status), Some("failed".to_string()));
    assert_eq!(
        view::stock(&w.env.redis, w.id()).await?,
        Some(10),
        "alice's unit and bob's back"
    );
    // The database's own stock was forced above; reconcile's database check restores it.
    w.reconcile().run(Utc::now()).await?;
    w.assert_conserved().await
}

/// A sale created a minute before its start must not wait for the preheat schedule.
async fn a_sale_created_inside_the_preheat_lead_is_buyable_at_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let now = Utc::now();
    let state = env.admin_state();
    let created = admin::create_activity(
        &state,
        &testkit::sale()
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
            &testkit::sale()
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

/// Preheat read the row, then an admin lowered the stock and committed, then preheat loads:
/// Redis must end with what the database holds, never the stale higher stock.
async fn preheat_racing_an_admin_lower_loads_what_the_database_holds(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let now = Utc::now();
    // Starts soon: inside the preheat lead, not loaded yet.
    let a = activity::insert(
        &env.pool,
        &testkit::sale()
            .title("soon")
            .stock(10)
            .limit(1)
            .window(
                now + ChronoDuration::minutes(10),
                now + ChronoDuration::hours(1),
            )
            .build()
            .settings()?,
    )
    .await?;
    let w = World::new(env, a);

    let paused = pause::arm("preheat.before_load", w.id());
    let preheat = w.preheat();
    let loading = tokio::spawn(async move { preheat.run(Utc::now()).await });
    within("preheat's read", paused.reached()).await?;

    let state = w.admin();
    let id = w.id();
    let lower = tokio::spawn(async move {
        let patch = ActivityPatch {
            total_stock: Some(6),
            ..ActivityPatch::default()
        };
        admin::update_activity(&state, id, &patch).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    paused.resume();
    joined("preheat", loading).await?;
    joined("the admin lower", lower).await?;

    let row = w.db_row().await?;
    assert_eq!(row.total_stock, 6);
    assert_eq!(
        view::stock(&w.env.redis, w.id()).await?,
        Some(row.remaining_stock)
    );
    Ok(())
}

/// Reconcile read Redis, then the database; between its reads and its write a purchase and a
/// cancel moved the stock away and back. Comparing the stock value would erase the cancel.
async fn stock_correction_skips_a_stock_that_moved_and_came_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bob = w.confirmed("bob", 1).await?;
    // Drift: Redis one unit above the database, so reconcile wants to correct it.
    w.set_stock(10).await?;

    let read = pause::arm("reconcile.stock.after_snapshot", w.id());
    let write = pause::arm("reconcile.stock.before_fix", w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's Redis read", read.reached()).await?;
    w.confirmed("alice", 1).await?;
    read.resume();
    within("reconcile's database read", write.reached()).await?;
    assert_eq!(
        w.cancel(bob.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    write.resume();
    joined("reconcile", run).await?;

    let stock = view::stock(&w.env.redis, w.id()).await?.unwrap_or(-1);
    let remaining = w.db_row().await?.remaining_stock;
    assert!(
        stock == 10 || stock == remaining,
        "redis stock {stock}: neither left alone (10) nor the database's {remaining}"
    );
    // The next quiet run corrects it.
    w.reconcile().run(Utc::now()).await?;
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(remaining));
    Ok(())
}

/// A lower commits in the database but the connection drops before COMMIT's answer: the
/// admin must not give Redis its units back on a guess.
async fn an_admin_commit_whose_reply_was_lost_is_not_reverted_in_redis(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let _lost = pause::arm_failure("admin.commit.lost_reply", w.id(), 1);
    let patch = ActivityPatch {
        total_stock: Some(6),
        ..ActivityPatch::default()
    };
    let answer = admin::update_activity(&w.admin(), w.id(), &patch).await;
    let row = w.db_row().await?;
    assert_eq!(row.total_stock, 6, "the commit went through");
    assert_eq!(
        view::stock(&w.env.redis, w.id()).await?,
        Some(row.remaining_stock),
        "answered {answer:?}"
    );
    w.assert_conserved().await
}

/// A lower writes its meta and version to Redis, then the connection drops with COMMIT unsent
/// and the read-back fails too: the admin cannot tell whether the change is in, so Redis keeps
/// the lowered stock and the new meta of a version the database never got. Preheat puts the
/// row's meta back (a version ahead of the row is not current), reconcile the stock.
async fn a_lower_that_never_committed_and_could_not_tell_is_healed_by_preheat(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let before = w.db_row().await?;
    let _unknown = pause::arm_failure("admin.commit.unknown", w.id(), 2);
    let patch = ActivityPatch {
        total_stock: Some(6),
        end_at: Some(before.end_at + chrono::Duration::minutes(30)),
        ..ActivityPatch::default()
    };
    let answer = admin::update_activity(&w.admin(), w.id(), &patch).await;
    assert!(answer.is_err(), "the outcome is unknown: {answer:?}");
    let row = w.db_row().await?;
    assert_eq!(
        (row.total_stock, row.config_version, row.end_at),
        (10, before.config_version, before.end_at),
        "nothing committed"
    );
    let version = || meta::loaded_version(&w.env.redis, w.id());
    assert_eq!(version().await?, Some(before.config_version + 1));
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(6));

    let report = w.preheat().run(Utc::now()).await?;
    assert_eq!(report.refreshed_ids, vec![w.id()]);
    assert_eq!(version().await?, Some(before.config_version));
    assert_eq!(
        view::view(&w.env.redis, w.id())
            .await?
            .map(|v| v.end_at.timestamp_millis()),
        Some(before.end_at.timestamp_millis()),
        "the row's window is back"
    );
    w.reconcile().run(Utc::now()).await?;
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    w.assert_conserved().await
}

/// A lower stops after writing its meta and version to Redis, before its commit; preheat runs
/// and finds Redis a version ahead of the row. It must not put the row's meta back under the
/// lower's feet: the lock is held, so preheat reports the sale busy, and after the commit
/// Redis and the row agree.
async fn a_preheat_during_a_lower_never_undoes_its_meta(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let before = w.db_row().await?;
    let end_at = before.end_at + chrono::Duration::minutes(30);
    let paused = pause::arm("admin.lower.before_commit", w.id());
    let lower = {
        let (admin, id) = (w.admin(), w.id());
        let patch = ActivityPatch {
            total_stock: Some(6),
            end_at: Some(end_at),
            ..ActivityPatch::default()
        };
        tokio::spawn(async move { admin::update_activity(&admin, id, &patch).await })
    };
    assert!(
        paused
            .reached_within(std::time::Duration::from_secs(10))
            .await
    );
    let report = w.preheat().run(Utc::now()).await?;
    assert_eq!(report.busy_ids, vec![w.id()], "{report:?}");
    let version = || meta::loaded_version(&w.env.redis, w.id());
    assert_eq!(version().await?, Some(before.config_version + 1));
    paused.resume();
    let updated = lower.await?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    assert_eq!(updated.config_version, before.config_version + 1);
    let report = w.preheat().run(Utc::now()).await?;
    assert_eq!(report.already_loaded_ids, vec![w.id()], "{report:?}");
    assert_eq!(
        view::view(&w.env.redis, w.id())
            .await?
            .map(|v| v.end_at.timestamp_millis()),
        Some(end_at.timestamp_millis())
    );
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(6));
    w.assert_conserved().await
}

/// Reconcile found alice in the set with no ledger entry; she then cancelled (and left the
/// set), the database check saw no live order, she bought again and the consumer settled.
/// Dropping her now would let her buy a second time.
async fn orphan_cleanup_never_drops_a_user_who_bought_again_meanwhile(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let first = w.confirmed("alice", 1).await?;

    let checking = pause::arm("reconcile.orphans.before_db_check", w.id());
    let dropping = pause::arm("reconcile.orphans.before_drop", w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's scan", checking.reached()).await?;
    assert_eq!(
        w.cancel(first.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    checking.resume();
    within("reconcile's database check", dropping.reached()).await?;
    w.confirmed("alice", 1).await?;
    dropping.resume();
    joined("reconcile", run).await?;

    assert!(w.users().await?.contains("alice"));
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(body["error"], "already_purchased", "{status} {body}");
    w.assert_conserved().await
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

/// The script ran but its reply did not arrive in time: the caller is told 503, so the
/// reservation must be given back now, through the database's claim, not after the grace.
async fn a_purchase_reply_lost_to_a_timeout_is_given_back_at_once(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let _lost = pause::arm_failure("entry.purchase.reply_lost", w.id(), 1);
    let (status, body) = w.buy("alice", 2).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    assert!(w.messages().await?.is_empty(), "nothing was sent");
    w.assert_conserved().await?;
    let (status, body) = w.buy("alice", 2).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "a retry is a fresh purchase: {body}"
    );
    Ok(())
}

/// Redis stalls (SIGSTOP) while buyers click; each gets a fast 503. Their scripts sit in
/// Redis's input buffer and run when it resumes: they must not leave reservations behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_stall_leaves_no_phantom_reservation() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let env = private
        .env(Duration::from_millis(300), Duration::from_secs(1))
        .await;
    let sale = env.open_sale(100, 1).await?;
    let w = World::new(env, sale);
    // A refused purchase loads the script, as the first clicks of a sale do.
    let (_, body) = w.buy("warm-up", 2).await;
    assert_eq!(body["error"], "quantity_exceeds_limit");

    private.signal("-STOP");
    let clicks = futures::future::join_all((0..40).map(|i| {
        let w = &w;
        async move { w.buy(&format!("u{i}"), 1).await.0 }
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    private.signal("-CONT");
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert!(
        clicks.iter().all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{clicks:?}"
    );
    let snap = ledger::snapshot(&w.env.redis, w.id()).await?;
    assert_eq!(snap.stock, Some(100), "{snap:?}");
    assert!(
        snap.ledger.is_empty(),
        "phantom reservations: {:?}",
        snap.ledger
    );
    assert_eq!(snap.participants, 0);

    // Told to retry, they can: once the breaker closes, a retry is accepted.
    let mut accepted = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if w.buy("u0", 1).await.0 == StatusCode::ACCEPTED {
            accepted = true;
            break;
        }
    }
    assert!(accepted, "u0 was told to retry and must be able to");
    Ok(())
}

/// The send times out after storing; the consumer commits; the entry's give-back finds the
/// live row (`Claim::Decided`) and `giveback::apply` drops the ledger entry with `settle.lua`.
/// That Redis call may fail (Redis slow or away for a moment: the same trouble that made the
/// send time out); the answer must still follow the row: 202, never 503 with an order behind
/// it. Standalone only: Redis is paused with SIGSTOP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_send_error_after_the_consumer_committed_never_answers_503() -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let mut env = private
        .env(Duration::from_millis(300), Duration::from_secs(1))
        .await;
    env.config.reconcile_grace = GRACE;
    let sale = env.open_sale(10, 5).await?;
    let w = World::new(env, sale);

    let _lost = pause::arm_failure("queue.send.lost_reply", w.id(), 1);
    let entry_paused = pause::arm("entry.after_send_error", w.id());
    let app = w.app.clone();
    let path = format!("/activities/{}/orders", w.id());
    let entry =
        tokio::spawn(
            async move { call(&app, request("POST", &path, Some(("alice", "")), None)).await },
        );
    within("the entry's send", entry_paused.reached()).await?;
    let message = w.messages().await?.pop().expect("the stored message");
    let done = w.consumer().handle_message(&message).await?;
    assert_eq!(done.outcome, Outcome::Committed);

    // Redis stops answering for a moment, just as the entry applies the row it found.
    private.signal("-STOP");
    entry_paused.resume();
    let answer = within("the entry", entry).await;
    private.signal("-CONT");
    let (status, body) = answer??;

    let row = w.order_of(message.attempt.request_id).await?;
    let sold = row.as_ref().is_some_and(|o| o.status == "confirmed");
    assert!(sold, "the consumer committed: {row:?}");
    assert_ne!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "alice was told 503 ({body}) yet holds confirmed order {row:?}"
    );
    Ok(())
}

/// Canceller A announced `c|A` and is on its way to the database (slow: a stalled connection,
/// a wait on the hot activity row, a paused process) when reconcile, past the grace period,
/// finds the row not cancelled. Were it to drop `c|A` as "never committed", A's commit would
/// give the unit to the database but never to Redis, and alice would stay in the set holding
/// nothing. Reconcile aborts A in the database first: A's commit is refused, and a retried
/// cancel goes through both.
async fn a_slow_cancel_is_aborted_before_reconcile_drops_its_entry(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 1).await?;

    let paused = pause::arm("cancel.after_begin", w.id());
    let a = w.spawn_cancel(&bought);
    within("canceller A announcing", paused.reached()).await?;
    let report = w.reconcile().run(testkit::after_grace(GRACE)).await?;
    let r = report.activity(w.id()).expect("reconciled");
    assert_eq!(
        r.settled, 1,
        "reconcile dropped A's entry as never committed"
    );
    paused.resume();
    // Reconcile aborted A before dropping its entry: A's commit is refused, nothing changed.
    let late = joined("canceller A", a).await?;
    let mut broken = w.violations().await?;
    if late != CancelOutcome::Busy {
        broken.push(format!("the aborted attempt answered {late:?}"));
    }
    // Retried, the cancel goes through and alice may buy again.
    let retried = w.cancel(bought.id).await?;
    if retried != (CancelOutcome::Cancelled { quantity: 1 }) {
        broken.push(format!("the retried cancel answered {retried:?}"));
    }
    broken.extend(w.violations().await?);
    let (status, body) = w.buy("alice", 1).await;
    if status != StatusCode::ACCEPTED {
        broken.push(format!(
            "alice cancelled her only order and is refused: {status} {body}"
        ));
    }
    broken.extend(w.drift_under_traffic().await?);
    verdict(broken)
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
    if processed.outcome == Outcome::Committed {
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
    let outcome = cancel::cancel_order(&w.env.pool, &w.env.redis, &bought, Utc::now()).await?;
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

/// Admin A lowers the stock 10 -> 5: fence + row lock, `adjust.lua` (Redis 5), then the row
/// update and COMMIT. Between the adjust and the commit A's lease runs out (A paused, or its
/// renewals lost while the COMMIT is already on the wire), and reconcile's stock fix takes the
/// free lock. Were it to read the remaining stock unfenced (10, A's lower not committed) and
/// A's COMMIT to land after, Redis would offer 10 units for the database's 5. The fix reads in
/// the transaction that records its token: it waits on A's row and reads the lower.
async fn the_stock_fix_never_undoes_an_admin_lower_whose_lease_ran_out(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let id = w.id();

    // Hold A between adjust.lua and its commit.
    sqlx::query(
        "create function hold_total_stock_update() returns trigger language plpgsql as $$
         begin perform pg_advisory_xact_lock(4242); return new; end $$",
    )
    .execute(&w.env.pool)
    .await?;
    sqlx::query(
        "create trigger hold_total_stock_update before update of total_stock on activities for each row
         when (old.total_stock is distinct from new.total_stock) execute function hold_total_stock_update()",
    )
    .execute(&w.env.pool)
    .await?;
    let mut holder = sqlx::PgConnection::connect(w.env.config.database_url.expose()).await?;
    sqlx::query("select pg_advisory_lock(4242)")
        .execute(&mut holder)
        .await?;

    // Reconcile gets past its database check, then waits before its stock step.
    let fixing = pause::arm("reconcile.stock.before_lock", id);
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's stock step", fixing.reached()).await?;

    let mut guard = lock::acquire(
        &w.env.redis,
        &w.env.pool,
        id,
        w.env.config.lock_ttl,
        w.env.config.lock_wait,
    )
    .await?;
    guard.stop_watchdog();
    let state = w.admin();
    let lower = tokio::spawn(async move {
        let patch = ActivityPatch {
            total_stock: Some(5),
            ..ActivityPatch::default()
        };
        let out = admin::update_with_guard(&state, &guard, &patch).await;
        drop(guard);
        out
    });
    within("A's adjust", async {
        while view::stock(&w.env.redis, id).await.ok().flatten() != Some(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await?;
    // A's lease runs out.
    let lock_key = w.env.redis.keys(id).lock;
    let _: i64 = w.env.redis.cmd(redis::cmd("DEL").arg(&lock_key)).await?;

    // Reconcile's stock step, from its cheap look on, while A holds the row: its fenced read
    // waits for A's transaction, and reads what A committed.
    fixing.resume();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A's commit goes through.
    sqlx::query("select pg_advisory_unlock(4242)")
        .execute(&mut holder)
        .await?;
    let updated = joined("A's lower", lower).await;
    let report = joined("reconcile", run).await?;

    let mut broken = Vec::new();
    let row = w.db_row().await?;
    let stock = view::stock(&w.env.redis, id).await?;
    if stock != Some(row.remaining_stock) {
        broken.push(format!(
            "redis {stock:?} vs database {} after {:?} (A answered {updated:?})",
            row.remaining_stock,
            report.activity(id).map(|r| r.stock_check)
        ));
    }
    broken.extend(w.violations().await?);
    verdict(broken)
}

/// Reconcile's orphan check marks the users it found with no ledger entry, reads the database,
/// then drops those with no live order while the mark is still its own. The purchase reads
/// only `users`: while the check looks, alice (an order) and ghost (a field with nothing behind
/// it) are refused; alice cancels before the database read (which then finds no order of
/// hers) and buys again before the drop: her reservation must keep her field, or she could
/// buy a second time. Ghost is dropped and then buys exactly once.
async fn an_orphan_check_never_lets_a_user_buy_twice(kind: RedisKind) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let first = w.confirmed("alice", 1).await?;
    w.orphan("ghost").await?;

    let checking = pause::arm("reconcile.orphans.before_db_check", w.id());
    let dropping = pause::arm("reconcile.orphans.before_drop", w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's marks", checking.reached()).await?;
    for user in ["alice", "ghost"] {
        let (status, body) = w.buy(user, 1).await;
        assert_eq!(
            body["error"], "already_purchased",
            "{user} marked: {status} {body}"
        );
    }
    assert_eq!(
        w.cancel(first.id).await?,
        CancelOutcome::Cancelled { quantity: 1 }
    );
    checking.resume();
    within("reconcile's database check", dropping.reached()).await?;
    let again = w.pending("alice", 1).await?;
    let (status, body) = w.buy("ghost", 1).await;
    assert_eq!(body["error"], "already_purchased", "ghost: {status} {body}");
    dropping.resume();
    joined("reconcile", run).await?;

    let users = w.users().await?;
    assert!(
        users.contains("alice") && !users.contains("ghost"),
        "{users:?}"
    );
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(body["error"], "already_purchased", "alice: {status} {body}");
    let done = w.consumer().handle_message(&again).await?;
    assert_eq!(done.outcome, Outcome::Committed, "{done:?}");
    w.confirmed("ghost", 1).await?;
    let (status, body) = w.buy("ghost", 1).await;
    assert_eq!(body["error"], "already_purchased", "ghost: {status} {body}");
    w.assert_conserved().await
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

/// Where reconcile's restore of a lost field stops in [`restore_race`]: after its read of the
/// live orders, before its mark; and after the database's read that follows the mark, before
/// it writes the field.
const RESTORE_POINTS: &[&str] = &[
    "reconcile.fields.before_mark",
    "reconcile.fields.before_restore",
];

/// What runs while reconcile's restore of alice's lost field is paused.
#[derive(Clone, Copy, Debug)]
enum Rival {
    /// Alice cancels the order whose field Redis lost.
    Cancel,
    /// Alice buys again (Redis no longer refuses her) and the consumer decides the purchase.
    Purchase,
    /// Redis loses the sale and preheat loads it again (a new load epoch).
    Reload,
}

/// Alice's confirmed order's field is lost; reconcile's restore stops at `point`, `rival` runs
/// to the end, the restore goes on. Never two live orders for one user, every unit in one
/// place (none given back twice, Redis never above what the database has), and afterwards a
/// cancel of whatever alice holds completes and gives its units back once.
async fn restore_race(kind: RedisKind, point: &'static str, rival: Rival) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let bought = w.confirmed("alice", 2).await?;
    anyhow::ensure!(testkit::lose_field(&w.env.redis, w.id(), "alice").await?);

    let paused = pause::arm(point, w.id());
    let reconcile = w.reconcile();
    let run = tokio::spawn(async move { reconcile.run(Utc::now()).await });
    within("reconcile's restore", paused.reached()).await?;
    match rival {
        Rival::Cancel => assert_eq!(
            w.cancel(bought.id).await?,
            CancelOutcome::Cancelled { quantity: 2 }
        ),
        Rival::Purchase => {
            let again = w.pending("alice", 1).await?;
            let done = w.consumer().handle_message(&again).await?;
            assert_eq!(done.outcome, Outcome::AlreadyPurchased, "{done:?}");
        }
        Rival::Reload => {
            w.unload().await?;
            w.preheat().run(Utc::now()).await?;
        }
    }
    paused.resume();
    let report = joined("reconcile", run).await?;
    assert!(report.errors.is_empty(), "{report:?}");

    let tally = order::tally(&w.env.pool, w.id()).await?;
    assert_eq!(tally.users_with_two_live, 0, "{tally:?}");
    w.assert_conserved().await?;
    if let Rival::Cancel = rival {
        assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
        assert!(
            !w.users().await?.contains("alice"),
            "{:?}",
            w.users().await?
        );
    } else {
        assert_eq!(tally.live, 1, "{tally:?}");
        assert_eq!(
            w.cancel(bought.id).await?,
            CancelOutcome::Cancelled { quantity: 2 }
        );
        assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    }
    assert_eq!(w.db_row().await?.remaining_stock, 10);
    // Alice holds nothing now and may buy, once.
    w.pending("alice", 1).await?;
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(body["error"], "already_purchased", "{status} {body}");
    w.assert_conserved().await
}

/// Reconcile restores alice's lost field while she cancels the order: the cancel restores the
/// field itself and completes; reconcile's write finds its mark gone (the cancel replaced it)
/// or, marking after the cancel, reads no live order. No field comes back for a cancelled
/// order, and the units come back once.
async fn restoring_a_lost_field_never_races_a_cancel_of_the_order(
    kind: RedisKind,
) -> anyhow::Result<()> {
    for point in RESTORE_POINTS {
        restore_race(kind, point, Rival::Cancel)
            .await
            .with_context(|| format!("paused at {point}"))?;
    }
    Ok(())
}

/// Reconcile restores alice's lost field while she buys again: Redis accepts her (it lost the
/// field that refused her), the database refuses a second live order, and the purchase's
/// reservation replaced reconcile's mark, so the restore writes nothing over it.
async fn restoring_a_lost_field_never_races_the_buyers_new_purchase(
    kind: RedisKind,
) -> anyhow::Result<()> {
    for point in RESTORE_POINTS {
        restore_race(kind, point, Rival::Purchase)
            .await
            .with_context(|| format!("paused at {point}"))?;
    }
    Ok(())
}

/// Reconcile restores alice's lost field while Redis loses the sale and it is loaded again
/// with `users` rebuilt from the live orders: the load empties the ledger (the mark goes), so
/// the restore writes nothing into the reloaded sale.
async fn restoring_a_lost_field_never_races_a_reload_of_the_sale(
    kind: RedisKind,
) -> anyhow::Result<()> {
    for point in RESTORE_POINTS {
        restore_race(kind, point, Rival::Reload)
            .await
            .with_context(|| format!("paused at {point}"))?;
    }
    Ok(())
}
