//! A draw where nothing left fits: the pool's queued entries are counted by the units they ask,
//! so once the stock left is below what any entry the cursor has not passed asks, the draw is
//! done without walking the rest of the pool; an entry that fits, however far down, is still
//! looked at; and a count is never low, whatever leaves between two steps.

use crate::enter_units;
use crate::fairness::tickets;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::domain::status::FailureReason;
use seckill_shared::infra::pause;
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol::giveback;
use seckill_shared::protocol::purchase::Outcome;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::draw;
use seckill_shared::store::draw::Drawn;
use seckill_shared::store::view;
use std::time::Duration;
use testkit::close_draw_window;
use testkit::invariants;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;

on_every_redis!(
    a_draw_where_nothing_left_fits_stops_without_walking_the_pool,
    an_entry_that_fits_is_looked_at_however_far_down,
    an_entry_passed_over_and_taken_back_between_two_steps_keeps_the_count,
);

/// Entrants of each sale here, each asking two units (three steps of tickets and more).
const ENTRANTS: usize = 3 * draw::STEP_TICKETS + 20;

/// A draw sale of `stock` units (two per order) and ENTRANTS entrants asking two units each,
/// entered as the entry's Redis user does: the sale and its entrants in ticket order.
async fn sale_of_pairs(env: &TestEnv, stock: i64) -> anyhow::Result<(i64, Vec<String>)> {
    let a = env.draw_activity(stock, 2).await?;
    let entry = &env.login(Function::Entry).1;
    for i in 0..ENTRANTS {
        let entered = enter_units(entry, a.id, &format!("p{i:03}"), 2).await;
        assert!(matches!(entered, Outcome::Queued { .. }), "{entered:?}");
    }
    let mut order: Vec<(i64, String)> = tickets(env, a.id)
        .await
        .into_iter()
        .map(|(u, t)| (t, u))
        .collect();
    order.sort();
    Ok((a.id, order.into_iter().map(|(_, u)| u).collect()))
}

/// Takes `user`'s entry out of the pool, as the 503 path does.
async fn take_back(redis: &Redis, activity_id: i64, user: &str) {
    let entry = draw::pool_entry(redis, activity_id, user)
        .await
        .unwrap()
        .expect("in the pool");
    assert!(draw::leave(redis, activity_id, user, entry.request_id)
        .await
        .unwrap());
}

/// `user` asks one unit instead of two: its entry taken back, then made again (same ticket).
async fn ask_one(redis: &Redis, activity_id: i64, user: &str) {
    take_back(redis, activity_id, user).await;
    let entered = enter_units(redis, activity_id, user, 1).await;
    assert!(matches!(entered, Outcome::Queued { .. }), "{entered:?}");
}

/// The draw's cursor: the index of the next ticket it would look at.
async fn cursor(env: &TestEnv, activity_id: i64) -> i64 {
    let k = env.redis.keys(activity_id);
    env.redis
        .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawAt"))
        .await
        .unwrap()
}

async fn won(env: &TestEnv, activity_id: i64, user: &str) -> bool {
    draw::pool_entry(&env.redis, activity_id, user)
        .await
        .unwrap()
        .is_some_and(|e| e.won)
}

/// Three units, every entrant asking two: the first ticket wins two, and with one unit left
/// nobody can win; the draw is done in that first step (its cursor one step in, not past the
/// whole pool), the rest not drawn, the unit left for first come, first served.
async fn a_draw_where_nothing_left_fits_stops_without_walking_the_pool(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let drawer = env.login(Function::Reconcile).1;
    let (id, order) = sale_of_pairs(&env, 3).await?;
    close_draw_window(&env, id).await;
    let drawn = draw::draw(&drawer, id, Duration::MAX).await?;
    assert_eq!(
        drawn,
        Drawn::Now {
            winners: 1,
            units: 2,
            entrants: ENTRANTS as i64
        }
    );
    assert!(won(&env, id, &order[0]).await);
    assert_eq!(
        cursor(&env, id).await,
        1 + draw::STEP_TICKETS as i64,
        "one step, not the {ENTRANTS} tickets"
    );
    assert_eq!(view::stock(&env.redis, id).await?, Some(1));
    let not_drawn = draw::pool(&env.redis, id)
        .await?
        .iter()
        .filter(|(_, e)| !e.won)
        .count();
    assert_eq!(not_drawn, ENTRANTS - 1);
    invariants::check(&env, id).await?;
    Ok(())
}

/// The same, but one entrant far down (its ticket past the third step) asks one unit: the draw
/// walks to it and it wins the unit left. Then, in another sale, that entrant taken back
/// before the draw (a 503): nothing left fits after the first winner, one step again.
async fn an_entry_that_fits_is_looked_at_however_far_down(kind: RedisKind) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let entry = env.login(Function::Entry).1;
    let drawer = env.login(Function::Reconcile).1;
    let far = 3 * draw::STEP_TICKETS + 10;

    let (id, order) = sale_of_pairs(&env, 3).await?;
    ask_one(&entry, id, &order[far]).await;
    close_draw_window(&env, id).await;
    let drawn = draw::draw(&drawer, id, Duration::MAX).await?;
    assert!(
        matches!(
            drawn,
            Drawn::Now {
                winners: 2,
                units: 3,
                ..
            }
        ),
        "{drawn:?}"
    );
    assert!(won(&env, id, &order[0]).await);
    assert!(won(&env, id, &order[far]).await, "the one-unit entry fits");
    assert_eq!(cursor(&env, id).await, 1 + far as i64 + 1);
    assert_eq!(view::stock(&env.redis, id).await?, Some(0));
    invariants::check(&env, id).await?;

    let (id, order) = sale_of_pairs(&env, 3).await?;
    ask_one(&entry, id, &order[far]).await;
    take_back(&entry, id, &order[far]).await;
    close_draw_window(&env, id).await;
    let drawn = draw::draw(&drawer, id, Duration::MAX).await?;
    assert!(
        matches!(
            drawn,
            Drawn::Now {
                winners: 1,
                units: 2,
                ..
            }
        ),
        "{drawn:?}"
    );
    let at = cursor(&env, id).await;
    assert!(at <= 1 + draw::STEP_TICKETS as i64, "one step: cursor {at}");
    assert_eq!(view::stock(&env.redis, id).await?, Some(1));
    invariants::check(&env, id).await?;
    Ok(())
}

/// Four entrants in ticket order (the rest taken back before the draw): P and Q ask two, S
/// (second step) one, R (third step) two; three units. The first step: P wins two, Q is
/// passed over (one unit left), S still fits. Between the steps Q is taken back (a 503's
/// clean-up) and P's reservation given back (its 503's compensation): three units again. Were
/// Q's leave to count it out a second time, the count of two-unit entries ahead would read 0
/// with R ahead: after S wins, two units left and "nothing fits", R never looked at. It keeps
/// the count: S wins, then R.
async fn an_entry_passed_over_and_taken_back_between_two_steps_keeps_the_count(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let (db, entry) = env.login(Function::Entry);
    let drawer = env.login(Function::Reconcile).1;
    let (id, order) = sale_of_pairs(&env, 3).await?;
    let (p, q) = (&order[0], &order[1]);
    let s = &order[draw::STEP_TICKETS + 8];
    let r = &order[2 * draw::STEP_TICKETS + 8];
    for user in &order {
        if ![p, q, s, r].contains(&user) {
            take_back(&entry, id, user).await;
        }
    }
    ask_one(&entry, id, s).await;
    close_draw_window(&env, id).await;

    let paused = pause::arm("draw.between_steps", id);
    let run = tokio::spawn(async move { draw::draw(&drawer, id, Duration::MAX).await });
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    assert_eq!(cursor(&env, id).await, 1 + draw::STEP_TICKETS as i64);
    assert!(won(&env, id, p).await && !won(&env, id, q).await);
    assert_eq!(view::stock(&env.redis, id).await?, Some(1));
    take_back(&entry, id, q).await;
    let p_entry = draw::pool_entry(&entry, id, p).await?.unwrap();
    let p_attempt = Attempt {
        request_id: p_entry.request_id,
        activity_id: id,
        user_id: p.clone(),
        quantity: 2,
        buckets: 1,
    };
    let given = giveback::give_back(&db, &entry, &p_attempt, FailureReason::Unavailable).await?;
    assert!(
        matches!(given, giveback::GiveBack::GivenBack(Some(2))),
        "{given:?}"
    );
    assert_eq!(view::stock(&env.redis, id).await?, Some(3));
    paused.resume();
    let drawn = run.await??;
    assert!(drawn.is_done(), "{drawn:?}");
    assert!(won(&env, id, s).await, "S fits");
    assert!(won(&env, id, r).await, "R fits the two units left after S");
    assert_eq!(view::stock(&env.redis, id).await?, Some(0));
    Ok(())
}
