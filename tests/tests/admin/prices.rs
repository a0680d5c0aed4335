//! A sale's price is the one its buyers pressed buy at: it changes only until 10 s before the
//! start, and, for a sale whose start was moved back into the future after it opened, not once
//! anyone bought (a reservation Redis holds, or an order).

use crate::{patch, setup};
use admin::update_activity;
use chrono::{Duration as ChronoDuration, Utc};
use serde_json::json;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::{consume, reserve};

on_every_redis!(a_sale_moved_back_before_its_start_keeps_its_price_once_anyone_bought);

async fn a_sale_moved_back_before_its_start_keeps_its_price_once_anyone_bought(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let (env, state) = setup(kind, 5000, 2000).await;
    let later = || json!({"startAt": (Utc::now() + ChronoDuration::minutes(10)).to_rfc3339()});
    let reprice = || patch(json!({"priceMinor": 4999}));

    // Nobody bought: moved back, its price may change again.
    let untouched = env.open_activity(5, 1).await?;
    update_activity(&state, untouched.id, &patch(later())).await?;
    let repriced = update_activity(&state, untouched.id, &reprice()).await?;
    assert_eq!(repriced.price_minor, 4999);

    // A reservation waits for its order (on the queue): its buyer saw the old price.
    let reserved = env.open_activity(5, 1).await?;
    let pending = reserve(&env, reserved.id, "alice", 1).await;
    update_activity(&state, reserved.id, &patch(later())).await?;
    let refused = update_activity(&state, reserved.id, &reprice()).await;
    assert!(
        matches!(&refused, Err(e) if e.code() == "conflict"),
        "a reservation fixes the price: {refused:?}"
    );

    // Its order confirmed, at the price it was reserved at.
    let rid = pending.attempt.request_id;
    let order_id = consume(&env, reserved.id, "alice", rid, 1).await?;
    let order = seckill_shared::domain::order::get(&env.pool, order_id)
        .await?
        .unwrap();
    assert_eq!(order.unit_price_minor, Some(reserved.price_minor));
    let refused = update_activity(&state, reserved.id, &reprice()).await;
    assert!(
        matches!(&refused, Err(e) if e.code() == "conflict"),
        "an order fixes the price: {refused:?}"
    );
    Ok(())
}
