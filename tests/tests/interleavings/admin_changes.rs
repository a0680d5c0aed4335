//! An admin's change of a running sale against preheat, reconcile and the entry: an extension
//! keeps the sale's buyers, a lower that preheat races, a commit whose reply was lost, a lower
//! that never committed (and the next change, which commits its version), a purchase that
//! carries the terms the change replaced.

use crate::{joined, within, world, World};
use axum::http::StatusCode;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::domain::activity::{self, Activity};
use seckill_shared::domain::settings::ActivityPatch;
use seckill_shared::infra::pause;
use seckill_shared::store::meta;
use seckill_shared::store::purchase;
use seckill_shared::store::view;
use std::time::Duration;
use testkit::on_every_redis;
use testkit::RedisKind;
use testkit::TestEnv;

on_every_redis!(
    extending_a_running_sale_keeps_its_buyers_and_reservations_alive,
    preheat_racing_an_admin_lower_loads_what_the_database_holds,
    an_admin_commit_whose_reply_was_lost_is_not_reverted_in_redis,
    a_lower_that_never_committed_and_could_not_tell_is_healed_by_preheat,
    a_preheat_during_a_lower_never_undoes_its_meta,
    a_purchase_carrying_replaced_terms_is_decided_by_the_new_ones,
    a_version_a_lower_never_committed_is_not_taken_for_the_next_changes,
    a_lower_whose_meta_write_fails_after_its_commit_is_refreshed_by_preheat,
);

/// `PUT endAt` later must move the expiry of every key of the sale, `users` and the ledger
/// included: otherwise they vanish at the old end + buffer and earlier buyers may buy again.
async fn extending_a_running_sale_keeps_its_buyers_and_reservations_alive(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    w.confirmed("alice", 1).await?;
    let (status, _) = w.buy("bob", 1).await; // stays pending
    assert_eq!(status, StatusCode::ACCEPTED);

    let new_end = w.activity.end_at + ChronoDuration::hours(6);
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
        &testkit::new_activity()
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

/// A lower takes its units in Redis, then the connection drops with COMMIT unsent and the
/// read-back fails too: the admin cannot tell whether the change is in, so Redis keeps the
/// lowered stock, under the row's meta and version (the new meta follows a commit only).
/// Preheat finds the sale current, reconcile puts the stock back.
async fn a_lower_that_never_committed_and_could_not_tell_is_healed_by_preheat(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let before = w.db_row().await?;
    lower_of_unknown_outcome(&w, &before).await;
    let row = w.db_row().await?;
    assert_eq!(
        (row.total_stock, row.config_version, row.end_at),
        (10, before.config_version, before.end_at),
        "nothing committed"
    );
    let version = || meta::loaded_version(&w.env.redis, w.id());
    let end = || async {
        let view = view::view(&w.env.redis, w.id()).await?;
        anyhow::Ok(view.map(|v| v.end_at.timestamp_millis()))
    };
    assert_eq!(version().await?, Some(before.config_version));
    assert_eq!(
        end().await?,
        Some(before.end_at.timestamp_millis()),
        "the row's window"
    );
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(6));

    let report = w.preheat().run(Utc::now()).await?;
    assert_eq!(report.already_loaded_ids, vec![w.id()], "{report:?}");
    assert_eq!(version().await?, Some(before.config_version));
    w.reconcile().run(Utc::now()).await?;
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(10));
    w.assert_conserved().await
}

/// A lower stops after taking its units in Redis, before its commit; preheat runs and finds
/// the row's version in Redis (the new meta follows the commit): the sale is current, and the
/// lowered stock is not touched. After the commit Redis holds the new meta and the row agrees.
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
    assert_eq!(report.already_loaded_ids, vec![w.id()], "{report:?}");
    let version = || meta::loaded_version(&w.env.redis, w.id());
    assert_eq!(version().await?, Some(before.config_version));
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(6));
    paused.resume();
    let updated = lower.await?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    assert_eq!(updated.config_version, before.config_version + 1);
    assert_eq!(version().await?, Some(before.config_version + 1));
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

/// The entry carries the sale's terms (its per-order limit among them) into the purchase
/// script. A buyer's request stops with its copy in hand while an admin lowers the limit, and
/// another's while an admin raises it: each is decided by the limit the meta holds when its
/// script runs, never by its copy, and the next request carries the new terms.
async fn a_purchase_carrying_replaced_terms_is_decided_by_the_new_ones(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 20).await?;
    // The first purchase reads the terms (limit 5) and the entry keeps them.
    let (status, body) = w.buy("alice", 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    let limit_to = |limit: i64| {
        let (state, id) = (w.admin(), w.id());
        async move {
            let patch = ActivityPatch {
                per_order_limit: Some(limit),
                ..ActivityPatch::default()
            };
            admin::update_activity(&state, id, &patch).await
        }
    };
    for (limit, qty, status, code) in [
        (2, 3, StatusCode::BAD_REQUEST, "quantity_exceeds_limit"),
        (4, 3, StatusCode::ACCEPTED, ""),
    ] {
        let paused = pause::arm("purchase.terms", w.id());
        let buyer = format!("buyer-of-{qty}-under-{limit}");
        let (app, id) = (w.app.clone(), w.id());
        let buying = tokio::spawn(async move {
            let path = format!("/activities/{id}/orders");
            let body = format!(r#"{{"quantity":{qty}}}"#);
            testkit::call(
                &app,
                testkit::request("POST", &path, Some((&buyer, "")), Some(&body)),
            )
            .await
        });
        within("the purchase with its copy of the terms", paused.reached()).await?;
        limit_to(limit).await?;
        paused.resume();
        let (got, body) = within("the purchase", buying).await??;
        assert_eq!(got, status, "limit {limit}, {qty} units: {body}");
        if !code.is_empty() {
            assert_eq!(body["error"], code, "{body}");
        }
        // The next request carries the new terms: at the limit it buys, above it it is refused.
        let (at, body) = w.buy(&format!("next-at-{limit}"), limit).await;
        assert_eq!(at, StatusCode::ACCEPTED, "{body}");
        let (above, body) = w.buy(&format!("next-above-{limit}"), limit + 1).await;
        assert_eq!(above, StatusCode::BAD_REQUEST, "{body}");
    }
    // alice 1, the two at each limit 2 + 4, the buyer of 3 under the raised limit.
    assert_eq!(
        view::stock(&w.env.redis, w.id()).await?,
        Some(20 - 1 - 2 - 4 - 3)
    );
    Ok(())
}

/// The config version of a change is the row's + 1, so a lower that never committed and the
/// next change share one. The lower takes its units and cannot tell whether it committed;
/// then the next change (a later end) commits that version and its function dies before its
/// Redis write. Redis must not hold the lower's fields under the version the row now has:
/// preheat finds the version behind the row and loads the row's meta, window and terms.
async fn a_version_a_lower_never_committed_is_not_taken_for_the_next_changes(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let before = w.db_row().await?;
    lower_of_unknown_outcome(&w, &before).await;
    // The next change, committed at the version the lower never committed; no Redis write.
    let next_end = before.end_at + chrono::Duration::minutes(60);
    let version: i64 = sqlx::query_scalar(
        "update activities set end_at = $2, config_version = config_version + 1
         where id = $1 returning config_version",
    )
    .bind(w.id())
    .bind(next_end)
    .fetch_one(&w.env.pool)
    .await?;
    assert_eq!(version, before.config_version + 1);

    let report = w.preheat().run(Utc::now()).await?;
    assert_eq!(report.refreshed_ids, vec![w.id()], "{report:?}");
    let view = view::view(&w.env.redis, w.id()).await?;
    assert_eq!(
        view.map(|v| v.end_at.timestamp_millis()),
        Some(next_end.timestamp_millis()),
        "the committed change's window, not the lower's"
    );
    let terms = purchase::read_terms(&w.env.redis, w.id().into()).await?;
    let terms = terms.map(|t| t.parts().map(String::from).collect::<Vec<_>>());
    assert_eq!(
        terms.as_ref().map(|t| (t[0].clone(), t[2].clone())),
        Some((version.to_string(), next_end.timestamp_millis().to_string()))
    );
    w.reconcile().run(Utc::now()).await?;
    w.assert_conserved().await
}

/// A lower commits, and its new meta's write to Redis (after the commit) fails: the change is
/// in, Redis holds the lowered stock under the row's older version, and a purchase there is
/// decided by the older terms. Preheat finds the version behind the row and loads the row's
/// meta; the stock stays lowered.
async fn a_lower_whose_meta_write_fails_after_its_commit_is_refreshed_by_preheat(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let w = world(kind, 10).await?;
    let before = w.db_row().await?;
    let patch = lower_to_six(&before);
    let end_at = patch.end_at.expect("a later end");
    let _failed = pause::arm_failure("admin.lower.meta", w.id(), 1);
    let updated = admin::update_activity(&w.admin(), w.id(), &patch)
        .await
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    assert_eq!(updated.config_version, before.config_version + 1);
    let version = || meta::loaded_version(&w.env.redis, w.id());
    assert_eq!(version().await?, Some(before.config_version));
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(6));

    let report = w.preheat().run(Utc::now()).await?;
    assert_eq!(report.refreshed_ids, vec![w.id()], "{report:?}");
    assert_eq!(version().await?, Some(updated.config_version));
    let view = view::view(&w.env.redis, w.id()).await?;
    assert_eq!(
        view.map(|v| v.end_at.timestamp_millis()),
        Some(end_at.timestamp_millis())
    );
    assert_eq!(view::stock(&w.env.redis, w.id()).await?, Some(6));
    w.assert_conserved().await
}

/// The lower the tests above send: the stock 10 → 6 and the end 30 minutes later.
fn lower_to_six(before: &Activity) -> ActivityPatch {
    ActivityPatch {
        total_stock: Some(6),
        end_at: Some(before.end_at + chrono::Duration::minutes(30)),
        ..ActivityPatch::default()
    }
}

/// Sends [`lower_to_six`] with its COMMIT left unsent and the read-back failing: the admin
/// cannot tell whether the change is in, and answers an error.
async fn lower_of_unknown_outcome(w: &World, before: &Activity) {
    let _unknown = pause::arm_failure("admin.commit.unknown", w.id(), 2);
    let answer = admin::update_activity(&w.admin(), w.id(), &lower_to_six(before)).await;
    assert!(answer.is_err(), "the outcome is unknown: {answer:?}");
}
