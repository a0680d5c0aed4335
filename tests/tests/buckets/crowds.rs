//! Crowds with demand far over the stock: exactly the stock sold whatever the bucket count, skewed
//! buyers emptying their home bucket early and still buying every unit, the last unit found from
//! any bucket, over HTTP without a 503, a refusal of a sold-out sale that costs about one
//! script call, and units a borrow leaves behind ending the `sold_out` a container remembers.

use crate::{
    attempt, attempt_with, commit_all, crowd, distinct_users, stocks, users_at_home, CLUSTER,
};
use futures::StreamExt;
use seckill_shared::domain::order;
use seckill_shared::domain::purchase::OrderMessage;
use seckill_shared::infra::pause;
use seckill_shared::protocol;
use seckill_shared::Refusal;
use std::time::Duration;
use testkit::invariants;
use testkit::TestEnv;

async fn sells_exactly_the_stock_to_a_crowd_ten_times_over(count: u32) -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(150, 1, count).await?;
    let users: Vec<String> = (0..1500).map(|i| format!("crowd-{i}")).collect();
    // Every user twice: one order per user must hold though they spread over the buckets.
    let (accepted, refused) = crowd(&env, &a, &users, 2).await;
    assert_eq!(accepted.len(), 150, "exactly the stock is accepted");
    assert_eq!(distinct_users(&accepted), 150, "no user twice");
    assert!(
        refused
            .iter()
            .all(|r| matches!(r, Refusal::SoldOut { .. } | Refusal::AlreadyPurchased)),
        "{refused:?}"
    );
    commit_all(&env, &accepted).await;
    assert_eq!(stocks(&env, &a).await, vec![0; count as usize], "0 left");
    assert_eq!(order::sold_quantity(&env.pool, a.id).await?, 150);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_buckets_sell_exactly_the_stock_to_a_crowd_ten_times_over() -> anyhow::Result<()> {
    sells_exactly_the_stock_to_a_crowd_ten_times_over(3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_buckets_sell_exactly_the_stock_to_a_crowd_ten_times_over() -> anyhow::Result<()> {
    sells_exactly_the_stock_to_a_crowd_ten_times_over(8).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn skewed_buyers_empty_their_home_bucket_early_and_still_buy_every_unit() -> anyhow::Result<()>
{
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(90, 1, 3).await?;
    // 900 buyers, 720 of them at home in bucket 0, which holds a third of the stock.
    let mut users = users_at_home(a.id, 3, 0, 720, "hot");
    users.extend(users_at_home(a.id, 3, 1, 90, "warm"));
    users.extend(users_at_home(a.id, 3, 2, 90, "cool"));
    let (accepted, _) = crowd(&env, &a, &users, 1).await;
    assert_eq!(accepted.len(), 90);
    assert_eq!(distinct_users(&accepted), 90);
    let hot = accepted
        .iter()
        .filter(|m| m.attempt.user_id.starts_with("hot"))
        .count();
    assert!(
        hot > 30,
        "bucket 0's buyers borrowed the others' units: {hot} of 90"
    );
    commit_all(&env, &accepted).await;
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    // Only bucket 0's buyers are left, all its units are gone: the next one is sold out.
    let late = users_at_home(a.id, 3, 0, 1, "late")[0].clone();
    let refused = attempt(&env, &a, &late, 1, 3).await?;
    assert!(
        matches!(refused, Err(Refusal::SoldOut { .. })),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_last_unit_anywhere_is_found_by_a_buyer_of_any_bucket() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(3, 2, 3).await?;
    // Sell bucket 0 and 1 dry with their own buyers, leave one unit in bucket 2.
    for (index, tag) in [(0, "zero"), (1, "one")] {
        let user = users_at_home(a.id, 3, index, 1, tag)[0].clone();
        let m = attempt(&env, &a, &user, 1, 3).await?.expect("accepted");
        commit_all(&env, &[m]).await;
    }
    let mut left = stocks(&env, &a).await;
    left.sort();
    assert_eq!(left.iter().sum::<i64>(), 1);
    // A buyer at home where nothing is left asks for 2: one unit is all there is.
    let empty = stocks(&env, &a).await.iter().position(|s| *s == 0).unwrap() as u32;
    let user = users_at_home(a.id, 3, empty, 1, "two")[0].clone();
    let refused = attempt(&env, &a, &user, 2, 3).await?;
    assert_eq!(refused.unwrap_err(), Refusal::SoldOut { stock_left: 1 });
    // Asked for 1, the same buyer gets the last unit, wherever it was.
    let m = attempt(&env, &a, &user, 1, 3)
        .await?
        .expect("the last unit");
    commit_all(&env, &[m]).await;
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_entry_sells_a_bucketed_sale_over_http_and_each_buyer_finds_their_order(
) -> anyhow::Result<()> {
    use axum::http::StatusCode;
    use testkit::call;
    use testkit::request;
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(4, 1, 3).await?;
    let app = env.entry_router();
    let path = format!("/activities/{}/orders", a.id);
    let buyers: Vec<String> = (0..3)
        .flat_map(|i| users_at_home(a.id, 3, i, 2, &format!("http{i}")))
        .collect();
    let mut accepted = Vec::new();
    for user in &buyers {
        let (status, body) = call(&app, request("POST", &path, Some((user, "")), None)).await;
        match status {
            StatusCode::ACCEPTED => accepted.push(user.clone()),
            StatusCode::CONFLICT => assert_eq!(body["error"], "sold_out", "{body}"),
            other => panic!("{other} {body}"),
        }
        if status == StatusCode::ACCEPTED {
            // The buyer's order, from the ledger of their home bucket, wherever that is.
            let me = format!("/activities/{}/orders/me", a.id);
            let (_, mine) = call(&app, request("GET", &me, Some((user, "")), None)).await;
            assert_eq!(mine["status"], "pending", "{user}: {mine}");
        }
    }
    assert_eq!(accepted.len(), 4, "every unit, whichever buckets held them");
    let sent: Vec<OrderMessage> = env
        .drain_messages(10)
        .await?
        .iter()
        .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
        .collect();
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|m| m.attempt.buckets == 3), "{sent:?}");
    commit_all(&env, &sent).await;
    for user in &accepted {
        let me = format!("/activities/{}/orders/me", a.id);
        let (_, mine) = call(&app, request("GET", &me, Some((user, "")), None)).await;
        assert_eq!(mine["status"], "confirmed", "{user}: {mine}");
    }
    let view = format!("/activities/{}", a.id);
    let (status, public) = call(&app, request("GET", &view, None, None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(public["remainingStock"], 0, "{public}");
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A sold-out sale of three buckets, then 300 refusals by one container (its hints): each
/// costs about one script call, the home bucket's purchase. The first short buyers ask the
/// donors and one sale-wide check finds every bucket empty; the buyers after them are told
/// `sold_out` on that check for its quarter second, and the donors a borrow found empty are
/// skipped for a second. Without hints every refusal asks both donors: three calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_of_a_sold_out_bucketed_sale_costs_about_one_script_call() -> anyhow::Result<()> {
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(3, 1, 3).await?;
    for i in 0..3 {
        let user = &users_at_home(a.id, 3, i, 1, "first")[0];
        assert!(attempt(&env, &a, user, 1, 3).await?.is_ok());
    }
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);

    let hints = protocol::buckets::Hints::new();
    let home = pause::count("purchase.home", a.id);
    let borrows = pause::count("purchase.borrow", a.id);
    let users: Vec<String> = (0..300).map(|i| format!("late-{i}")).collect();
    let refused: Vec<Refusal> = futures::stream::iter(&users)
        .map(|u| {
            let (env, a, hints) = (&env, &a, &hints);
            async move {
                attempt_with(env, hints, a, u, 1, 3)
                    .await
                    .unwrap()
                    .unwrap_err()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(refused.iter().all(|r| matches!(r, Refusal::SoldOut { .. })));
    let calls = f64::from(home.hits() + borrows.hits()) / users.len() as f64;
    assert!(
        calls <= 1.2,
        "{calls:.2} script calls per refusal ({} home, {} borrows)",
        home.hits(),
        borrows.hits()
    );
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A borrow that took more than its buyer needs (half the donor's stock) is slow to put the
/// units into its home bucket; meanwhile every bucket is bought empty and a short buyer's
/// sale-wide check tells her `sold_out`, which the container remembers. The slow buyer then
/// buys and leaves a unit in her home bucket: the container forgets the `sold_out`, and the
/// next short buyer borrows that unit (on the remembered check she was told `sold_out` with a
/// unit in stock, and the sale's crowd could end with it unsold).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn units_a_borrow_leaves_in_its_home_bucket_end_a_remembered_sold_out() -> anyhow::Result<()>
{
    let env = std::sync::Arc::new(TestEnv::new(CLUSTER).await?);
    let a = env.open_activity_in_buckets(12, 1, 3).await?;
    // Buckets 0 and 2 bought empty; bucket 1 keeps its 4 units.
    for index in [0, 2] {
        for user in users_at_home(a.id, 3, index, 4, "first") {
            assert!(attempt(&env, &a, &user, 1, 3).await?.is_ok());
        }
    }
    assert_eq!(stocks(&env, &a).await, vec![0, 4, 0]);
    let hints = protocol::buckets::Hints::new();
    let paused = pause::arm("purchase.after_borrow", a.id);
    let slow = {
        let (env, a, hints) = (env.clone(), a.clone(), hints.clone());
        let user = users_at_home(a.id, 3, 0, 1, "slow")[0].clone();
        tokio::spawn(async move { attempt_with(&env, &hints, &a, &user, 1, 3).await.unwrap() })
    };
    assert!(paused.reached_within(Duration::from_secs(10)).await);
    assert_eq!(
        stocks(&env, &a).await,
        vec![0, 2, 0],
        "half of 4 on its way"
    );
    for user in users_at_home(a.id, 3, 1, 2, "donor") {
        assert!(attempt(&env, &a, &user, 1, 3).await?.is_ok());
    }
    let told = users_at_home(a.id, 3, 2, 2, "short");
    let refused = attempt_with(&env, &hints, &a, &told[0], 1, 3).await?;
    assert!(
        matches!(refused, Err(Refusal::SoldOut { .. })),
        "{refused:?}"
    );
    paused.resume();
    assert!(slow.await?.is_ok());
    assert_eq!(
        stocks(&env, &a).await,
        vec![1, 0, 0],
        "the unit the slow buyer left"
    );
    let next = attempt_with(&env, &hints, &a, &told[1], 1, 3).await?;
    assert!(next.is_ok(), "the unit left in bucket 0 is found: {next:?}");
    assert_eq!(stocks(&env, &a).await, vec![0, 0, 0]);
    invariants::check(&env, a.id).await?;
    Ok(())
}

/// A crowd through the entry's router on the cluster, 128 at a time: 1,500 buyers trying
/// twice for 300 units in three buckets. No 503, every unit sold, the stock left 0 in every
/// bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_over_http_buys_every_unit_of_a_bucketed_sale_without_a_503() -> anyhow::Result<()>
{
    use axum::http::StatusCode;
    let env = TestEnv::new(CLUSTER).await?;
    let a = env.open_activity_in_buckets(300, 1, 3).await?;
    let app = env.entry_router();
    let requests: Vec<String> = (0..2)
        .flat_map(|_| (0..1500).map(|i| format!("crowd-{i}")))
        .collect();
    let answers: Vec<(StatusCode, serde_json::Value)> = futures::stream::iter(&requests)
        .map(|user| {
            let (app, a) = (&app, &a);
            async move { testkit::buy(app, a, user, None).await }
        })
        .buffer_unordered(128)
        .collect()
        .await;
    let count = |s: StatusCode| answers.iter().filter(|(status, _)| *status == s).count();
    let unavailable: Vec<&serde_json::Value> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(_, b)| b)
        .take(3)
        .collect();
    assert_eq!(count(StatusCode::SERVICE_UNAVAILABLE), 0, "{unavailable:?}");
    let mut seen: std::collections::BTreeMap<(u16, String), usize> = Default::default();
    for (s, b) in &answers {
        let code = b["error"]
            .as_str()
            .or(b["status"].as_str())
            .unwrap_or("")
            .to_string();
        *seen.entry((s.as_u16(), code)).or_default() += 1;
    }
    let left = stocks(&env, &a).await;
    assert_eq!(
        count(StatusCode::ACCEPTED),
        300,
        "answers {seen:?}, stocks {left:?}"
    );
    assert_eq!(
        count(StatusCode::CONFLICT),
        requests.len() - 300,
        "{seen:?}"
    );
    assert_eq!(left, vec![0, 0, 0]);
    Ok(())
}
