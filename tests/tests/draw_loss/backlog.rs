//! Redis loses the sale inside the window while some of its entries are still on the queue (a
//! partial backlog: some written, the rest not): the draw waits for the queue, and every
//! entrant ends drawn by the cutoff rule; past the wait's bound, an entry that comes back after
//! the draw began is told so by its own status and counted in the public view, never a plain
//! `not_drawn`.

use crate::{entrants, every_entrant_ends_drawn_or_not, lose_and_reload, lowest_tickets};
use axum::http::StatusCode;
use axum::Router;
use seckill_shared::domain::activity::Activity;
use seckill_shared::domain::draw::{self as kept, Entry};
use seckill_shared::infra::shape::Function;
use seckill_shared::store::draw::{self, Drawn};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use testkit::on_every_redis;
use testkit::{buy, call, close_draw_window, consume_queue, draw_entry_rows, my_status, request};
use testkit::{consume_queue_of, order_rows};
use testkit::{RedisKind, TestEnv};

on_every_redis!(
    a_loss_with_entries_still_queued_waits_for_them_and_draws_by_the_cutoff,
    an_entry_back_after_the_wait_reads_entered_late_and_is_counted,
    orders_on_their_own_queue_neither_hold_the_draw_nor_wait_behind_entries,
    an_entry_kept_while_a_re_entry_is_in_flight_stands_again_after_its_503,
    an_entry_whose_put_back_failed_is_put_back_by_the_drawer_before_it_draws,
    a_kept_entry_put_back_after_the_draw_is_marked_late_by_whoever_puts_it_back,
);

/// Twelve entrants, all answered 202 `queued`, their messages on the queue. The entrant with
/// the lowest ticket and three others are the backlog; the other eight are written as the
/// consumer writes them (as its role). Answers the sale's entrants, the backlog, and the
/// tickets.
async fn partial_backlog(
    env: &TestEnv,
    app: &Router,
    a: &Activity,
) -> anyhow::Result<(Vec<String>, BTreeSet<String>, HashMap<String, i64>)> {
    let users = entrants(app, a, "e", 12).await;
    let tickets = crate::tickets_of(env, a, &users).await;
    let mut by_ticket: Vec<&String> = users.iter().collect();
    by_ticket.sort_by_key(|u| tickets[*u]);
    let backlog: BTreeSet<String> = [0, 4, 7, 10]
        .into_iter()
        .map(|i| by_ticket[i].clone())
        .collect();
    let mut written = Vec::new();
    for u in users.iter().filter(|u| !backlog.contains(*u)) {
        let e = draw::pool_entry(&env.redis, a.id, u)
            .await?
            .expect("entered");
        written.push(Entry {
            request_id: e.request_id,
            user_id: u.clone(),
            quantity: e.quantity,
        });
    }
    let (db, _) = env.login(Function::Consumer);
    let mut tx = db.begin().await?;
    kept::insert_entries(&mut tx, a.id, &written).await?;
    tx.commit().await?;
    assert_eq!(draw_entry_rows(env, a.id).await, 8);
    Ok((users, backlog, tickets))
}

/// The partial backlog, then the loss and the reload: the rebuild puts back the eight written
/// entries. The window closes; the drawer's run finds the queue holding entries and waits (no
/// step, nobody drawn). The consumer then writes the backlog, putting each entry back with its
/// ticket, and the drawer's next run draws: the three lowest tickets of all twelve win (the
/// lowest among them was in the backlog), every other entrant reads `not_drawn`.
async fn a_loss_with_entries_still_queued_waits_for_them_and_draws_by_the_cutoff(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let (users, backlog, _) = partial_backlog(&env, &app, &a).await?;
    lose_and_reload(&env, &a).await;
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), 8);
    close_draw_window(&env, a.id).await;

    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert!(!r.drawn, "the draw waits for the queued entries: {r:?}");
    assert_eq!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Waiting { entrants: 8 }
    );

    consume_queue(&env).await?;
    assert_eq!(draw::pool(&env.redis, a.id).await?.len(), 12);
    let expected = lowest_tickets(&env, &a, &users, 3).await;
    assert!(expected.iter().any(|u| backlog.contains(u)));
    let winners = every_entrant_ends_drawn_or_not(&env, &app, &a, &users).await;
    assert_eq!(winners, expected, "the lowest tickets of every entrant won");
    Ok(())
}

/// The partial backlog, the loss and the reload, and a drawer whose wait bound has passed: it
/// draws over the eight entries the rebuild put back. The backlog's entries come back after
/// the draw: the one whose ticket is below the cutoff (the lowest of all) reads `entered_late`,
/// never `not_drawn`, and the public view counts every late entry; one above the cutoff is an
/// ordinary loser. The eight drawn entrants end by the cutoff rule. Lost once more after the
/// record, the sale loads with the late entries still late and still counted.
async fn an_entry_back_after_the_wait_reads_entered_late_and_is_counted(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let (users, backlog, tickets) = partial_backlog(&env, &app, &a).await?;
    lose_and_reload(&env, &a).await;
    close_draw_window(&env, a.id).await;

    let report = env
        .reconcile_with(|c| c.config.draw_entry_wait = Duration::ZERO)
        .run(chrono::Utc::now())
        .await?;
    let r = report.activity(a.id).unwrap();
    assert!(r.drawn && !r.orders_pending, "{r:?}");
    consume_queue(&env).await?;

    let drawn: Vec<String> = users
        .iter()
        .filter(|u| !backlog.contains(*u))
        .cloned()
        .collect();
    let expected = lowest_tickets(&env, &a, &drawn, 3).await;
    let cutoff = tickets[expected.iter().max_by_key(|u| tickets[*u]).unwrap()];
    let mut late = 0;
    for u in &users {
        let status = my_status(&app, &a, u).await;
        let want = if expected.contains(u) {
            "confirmed"
        } else if backlog.contains(u) && tickets[u] <= cutoff {
            late += 1;
            "entered_late"
        } else {
            "not_drawn"
        };
        assert_eq!(status, want, "{u} (ticket {}, cutoff {cutoff})", tickets[u]);
    }
    assert!(late >= 1, "the lowest ticket came back late");
    // The view caches for up to 250 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = call(
        &app,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["draw"]["lateEntries"], late, "{body}");

    // Lost again after the record: the rebuild puts the late entries back late (the database
    // keeps them so), and the recorded cutoff is final from its first call.
    lose_and_reload(&env, &a).await;
    for u in backlog.iter().filter(|u| tickets[*u] <= cutoff) {
        assert_eq!(my_status(&app, &a, u).await, "entered_late", "{u}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, body) = call(
        &app,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;
    assert_eq!(body["draw"]["lateEntries"], late, "{body}");
    Ok(())
}

/// Entries and orders on queues of their own. A draw sale rebuilt after a loss, its entries all
/// written, its window closed: five first-come purchases of another sale leave their order
/// messages on the order queue (unconsumed), and the drawer does not wait for them: it draws,
/// records and orders, as it reads the entries' queue alone (on one shared queue it waited for
/// the orders until its bound). Then a crowd of 20 entries of a third sale is held on the
/// entries' queue: the consumer of the order queue writes the five orders without reading one
/// entry, and the entries are kept once their queue is consumed.
async fn orders_on_their_own_queue_neither_hold_the_draw_nor_wait_behind_entries(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let (orders_url, entries_url) = (env.queue.url.clone(), env.config.entry_queue().to_string());
    assert_ne!(
        orders_url, entries_url,
        "the test's entries have a queue of their own"
    );

    let a = env.draw_activity(3, 1).await?;
    let users = entrants(&app, &a, "e", 8).await;
    assert_eq!(consume_queue_of(&env, &entries_url).await?, 0);
    assert_eq!(draw_entry_rows(&env, a.id).await, 8);
    lose_and_reload(&env, &a).await;
    let f = env.open_activity(10, 1).await?;
    for i in 0..5 {
        let (status, body) = buy(&app, &f, &format!("f{i}"), None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    close_draw_window(&env, a.id).await;
    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert!(
        r.drawn && !r.orders_pending,
        "five orders on the order queue hold no draw: {r:?}"
    );
    let expected = lowest_tickets(&env, &a, &users, 3).await;
    for u in &users {
        let want = if expected.contains(u) {
            "confirmed"
        } else {
            "not_drawn"
        };
        assert_eq!(my_status(&app, &a, u).await, want, "{u}");
    }

    let b = env.draw_activity(3, 1).await?;
    entrants(&app, &b, "c", 20).await;
    assert!(order_rows(&env, f.id).await.is_empty());
    assert_eq!(consume_queue_of(&env, &orders_url).await?, 5);
    assert_eq!(
        order_rows(&env, f.id).await.len(),
        5,
        "no order waited behind an entry"
    );
    assert_eq!(
        draw_entry_rows(&env, b.id).await,
        0,
        "the entries are still queued"
    );
    assert_eq!(consume_queue_of(&env, &entries_url).await?, 0);
    assert_eq!(draw_entry_rows(&env, b.id).await, 20);
    Ok(())
}

/// Redis loses the sale before Alice's entry is written, and the rebuilt pool lacks it. She
/// enters again, and while that second request's send is held (its batch paused before its
/// call, on a dead queue) the consumer keeps her first entry: her field in the pool is the
/// second's live entry, so nothing is added. The second's send then fails: 503, and it leaves
/// the pool. Answers her first request id.
async fn a_re_entry_answered_503_while_the_first_is_kept(
    env: &TestEnv,
    app: &Router,
    a: &Activity,
) -> anyhow::Result<uuid::Uuid> {
    use seckill_shared::infra::pause;
    use seckill_shared::infra::sqs::Queues;
    let (status, body) = buy(app, a, "alice", None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("queued")),
        "{body}"
    );
    let first: uuid::Uuid = body["requestId"].as_str().unwrap().parse()?;
    lose_and_reload(env, a).await;
    assert_eq!(draw::pool_entry(&env.redis, a.id, "alice").await?, None);

    let dead = Queues {
        entries: testkit::dead_queue(env).with_send_slots(1),
        ..env.queues()
    };
    let broken = env.entry_router_on(dead, |_| {});
    let held = pause::arm("queue.coalesce.before_send", a.id);
    let second = {
        let (broken, a) = (broken.clone(), a.clone());
        tokio::spawn(async move { buy(&broken, &a, "alice", None).await })
    };
    assert!(held.reached_within(Duration::from_secs(10)).await);
    consume_queue(env).await?;
    assert_eq!(
        draw_entry_rows(env, a.id).await,
        1,
        "the first entry is kept"
    );
    let holder = draw::pool_entry(&env.redis, a.id, "alice").await?.unwrap();
    assert_ne!(holder.request_id, first, "the second holds her field");
    held.resume();
    let (status, body) = second.await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    Ok(first)
}

/// The re-entry answered 503: her first entry, answered 202 `queued` and kept, goes back in
/// its place at once (before: her field stayed the second's tombstone and the first took part
/// in no draw), and she wins.
async fn an_entry_kept_while_a_re_entry_is_in_flight_stands_again_after_its_503(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let first = a_re_entry_answered_503_while_the_first_is_kept(&env, &app, &a).await?;

    let back = draw::pool_entry(&env.redis, a.id, "alice").await?;
    assert_eq!(
        back.map(|e| e.request_id),
        Some(first),
        "her kept entry stands again"
    );
    close_draw_window(&env, a.id).await;
    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert!(r.drawn && !r.orders_pending, "{r:?}");
    assert_eq!(my_status(&app, &a, "alice").await, "confirmed");
    Ok(())
}

/// The same, but the 503's own put-back does not get through (its function killed, its
/// database read failed): her field stays the second's tombstone. The drawer's clean-up of the
/// 503 claims puts her first entry back before its first step, though its own leave found the
/// entry out already (before: only a leave of its own put back), and she wins.
async fn an_entry_whose_put_back_failed_is_put_back_by_the_drawer_before_it_draws(
    kind: RedisKind,
) -> anyhow::Result<()> {
    use seckill_shared::infra::pause;
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let failed = pause::arm_failure("entry.put_back", a.id, 1);
    let first = a_re_entry_answered_503_while_the_first_is_kept(&env, &app, &a).await?;
    assert_eq!(failed.hits(), 1, "the 503's put-back failed");
    let held = draw::pool_entry(&env.redis, a.id, "alice").await?;
    assert_ne!(held.map(|e| e.request_id), Some(first), "not back yet");

    close_draw_window(&env, a.id).await;
    let report = env.reconcile().run(chrono::Utc::now()).await?;
    let r = report.activity(a.id).unwrap();
    assert!(r.drawn && !r.orders_pending, "{r:?}");
    assert_eq!(my_status(&app, &a, "alice").await, "confirmed");
    let order = order_rows(&env, a.id).await;
    assert_eq!(order.len(), 2, "her 503's claim and her order: {order:?}");
    Ok(())
}

/// A kept entry put back only once the draw had begun is late, and the database keeps it so
/// whoever put it back. Twelve entrants; the two with the lowest tickets each have a kept first
/// entry and a later request answered 503 whose tombstone holds their field, and a draw ran
/// before either was put back (both 503s' own put-backs failed, and the drawer's clean-up read
/// the claims before they committed). The first's 503 puts hers back late after all, but dies
/// before it marks it; the drawer's next clean-up marks it (found held late), and puts the
/// second's back late and marks it. Both read `entered_late`, never `not_drawn` (before: the
/// drawer put back only what its own leave took out, and a lost mark was never made again).
async fn a_kept_entry_put_back_after_the_draw_is_marked_late_by_whoever_puts_it_back(
    kind: RedisKind,
) -> anyhow::Result<()> {
    use seckill_shared::domain::purchase::Attempt;
    use seckill_shared::domain::status::FailureReason;
    use seckill_shared::infra::pause;
    use seckill_shared::protocol::{draw as drawing, giveback};
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(3, 1).await?;
    let users = entrants(&app, &a, "e", 12).await;
    let tickets = crate::tickets_of(&env, &a, &users).await;
    let mut by_ticket: Vec<&String> = users.iter().collect();
    by_ticket.sort_by_key(|u| tickets[*u]);
    let (by_entry, by_drawer) = (by_ticket[0].clone(), by_ticket[1].clone());

    let (entry_db, entry_redis) = env.login(Function::Entry);
    let (consumer_db, _) = env.login(Function::Consumer);
    let (mut firsts, mut seconds) = (HashMap::new(), HashMap::new());
    for u in [&by_entry, &by_drawer] {
        let second = draw::pool_entry(&env.redis, a.id, u).await?.unwrap();
        let first = Entry {
            request_id: uuid::Uuid::new_v4(),
            user_id: u.clone(),
            quantity: 1,
        };
        let mut tx = consumer_db.begin().await?;
        kept::insert_entries(&mut tx, a.id, std::slice::from_ref(&first)).await?;
        tx.commit().await?;
        let attempt = Attempt {
            request_id: second.request_id,
            activity_id: a.id,
            user_id: u.clone(),
            quantity: 1,
            buckets: 1,
        };
        giveback::claim(&entry_db, &attempt, FailureReason::Unavailable).await?;
        assert!(draw::leave(&entry_redis, a.id, u, second.request_id).await?);
        firsts.insert(u.clone(), first.request_id);
        seconds.insert(u.clone(), second.request_id);
    }
    close_draw_window(&env, a.id).await;
    assert!(matches!(
        draw::draw(&env.redis, a.id, Duration::MAX).await?,
        Drawn::Now { .. }
    ));

    let left = seconds[&by_entry];
    let dies = pause::arm_failure("draw.put_back.before_mark", a.id, 1);
    let put = drawing::put_back_other_entry(&entry_redis, &entry_db, a.id, &by_entry, left, false);
    assert!(put.await.is_err(), "put back, not marked");
    assert_eq!(dies.hits(), 1);
    let back = draw::pool_entry(&env.redis, a.id, &by_entry).await?;
    assert_eq!(back.map(|e| e.request_id), Some(firsts[&by_entry]));
    assert_eq!(late_rows(&env, &a).await, 0, "its mark lost");
    let report = env.reconcile().run(chrono::Utc::now()).await?;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    for u in [&by_entry, &by_drawer] {
        let back = draw::pool_entry(&env.redis, a.id, u).await?;
        assert_eq!(back.map(|e| e.request_id), Some(firsts[u]), "{u} back");
        assert_eq!(my_status(&app, &a, u).await, "entered_late", "{u}");
    }
    assert_eq!(late_rows(&env, &a).await, 2, "the database keeps both late");
    Ok(())
}

/// The sale's entries the database keeps as late.
async fn late_rows(env: &TestEnv, a: &Activity) -> i64 {
    sqlx::query_scalar("select count(*) from draw_entries where activity_id = $1 and late")
        .bind(a.id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}
