//! Live stock changes during a sale: conserved with concurrent buyers, a lower below what the
//! database sold refused (loaded or not), and a failed database write giving Redis its units back.

use crate::{db_activity, ms, patch, setup, ADMIN};
use admin::{router, update_activity};
use axum::http::StatusCode;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::store::ledger;
use seckill_shared::store::purchase;
use seckill_shared::store::purchase::Reservation;
use seckill_shared::Refusal;
use serde_json::{json, Value};
use testkit::call;
use testkit::on_every_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::{redis_stock, set_db_stock_by_hand};
use uuid::Uuid;

on_every_redis!(
    live_stock_changes_conserve_stock_with_concurrent_buyers,
    lowering_below_db_sold_is_refused_even_when_not_loaded,
    a_failed_db_write_gives_redis_its_units_back,
);

async fn live_stock_changes_conserve_stock_with_concurrent_buyers(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: a running sale of 200, 300 buyers of one unit each.
    let (env, state) = setup(kind, 2000, 2000).await;
    let a = env.open_activity(200, 1).await.unwrap();
    let buyers: Vec<_> = (0..300)
        .map(|i| {
            let redis = env.redis.clone();
            tokio::spawn(async move {
                tokio::time::sleep(ms((i % 30) * 5)).await;
                testkit::purchase(
                    &redis,
                    a.id,
                    &format!("u{i}"),
                    1,
                    Uuid::new_v4(),
                    purchase::far_deadline(),
                )
                .await
                .unwrap()
            })
        })
        .collect();

    // Act: meanwhile an admin raises and lowers the total.
    let mut applied = Vec::new();
    for total in [260, 230, 320, 240, 280, 150] {
        match update_activity(&state, a.id, &patch(json!({"totalStock": total}))).await {
            Ok(row) => applied.push(row.total_stock),
            Err(e) => assert_eq!(e.code(), "conflict", "{e}"),
        }
        tokio::time::sleep(ms(10)).await;
    }
    let mut accepted = 0;
    for b in buyers {
        match b.await.unwrap() {
            Ok(Reservation { stock_left, .. }) => {
                assert!(stock_left >= 0);
                accepted += 1;
            }
            Err(Refusal::SoldOut { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    // Assert: conservation (nothing consumed, so confirmed = 0), no oversell.
    assert!(!applied.is_empty());
    let row = db_activity(&env, a.id).await;
    let snap = ledger::snapshot(&env.redis, a.id).await.unwrap();
    let stock = snap.stock.unwrap();
    assert!(stock >= 0);
    assert_eq!(snap.pending_count(), accepted);
    assert_eq!(
        stock + snap.pending_quantity(),
        row.total_stock,
        "redis_stock + pending = total"
    );
    assert!(snap.pending_quantity() <= row.total_stock);
    assert_eq!(row.remaining_stock, row.total_stock);
    assert_eq!(row.config_version, 1 + applied.len() as i64);

    // Lowering below what is reserved is refused and changes nothing.
    let sold = snap.pending_quantity();
    let err = update_activity(&state, a.id, &patch(json!({"totalStock": sold - 1})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "conflict");
    assert_eq!(err.status(), StatusCode::CONFLICT);
    let after = db_activity(&env, a.id).await;
    assert_eq!(
        (after.total_stock, after.config_version),
        (row.total_stock, row.config_version)
    );
    assert_eq!(redis_stock(&env, a.id).await, Some(stock));

    // Lowering to exactly what is reserved sells out and conserves.
    if sold > 0 {
        update_activity(&state, a.id, &patch(json!({"totalStock": sold})))
            .await
            .unwrap();
        assert_eq!(redis_stock(&env, a.id).await, Some(0));
    }

    // The detail view reports zero drift.
    let app = router(state);
    let (status, body) = call(
        &app,
        request(
            "GET",
            &format!("/admin/activities/{}", a.id),
            Some(ADMIN),
            None,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stats"]["drift"], json!(0), "{body}");
    assert_eq!(body["stats"]["pendingCount"], json!(accepted), "{body}");
    assert_eq!(body["stats"]["participants"], json!(accepted), "{body}");
    Ok(())
}

async fn lowering_below_db_sold_is_refused_even_when_not_loaded(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // An activity the DB knows is partly sold but Redis has not loaded (or already dropped).
    let (env, state) = setup(kind, 2000, 1000).await;
    let app = router(state.clone());
    let now = Utc::now();
    let body = json!({
        "title": "later", "totalStock": 10, "perOrderLimit": 1, "priceMinor": 1999, "currency": "usd",
        "startAt": (now + ChronoDuration::days(1)).to_rfc3339(),
        "endAt": (now + ChronoDuration::days(2)).to_rfc3339(),
    });
    let (status, created) = call(
        &app,
        request(
            "POST",
            "/admin/activities",
            Some(ADMIN),
            Some(&body.to_string()),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_i64().unwrap();
    set_db_stock_by_hand(&env, id, 4).await;

    let err = update_activity(&state, id, &patch(json!({"totalStock": 5})))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "conflict");
    let ok = update_activity(&state, id, &patch(json!({"totalStock": 6})))
        .await
        .unwrap();
    assert_eq!((ok.total_stock, ok.remaining_stock), (6, 0));
    assert_eq!(
        redis_stock(&env, id).await,
        None,
        "admin never loads a sale"
    );

    let (_, detail) = call(
        &app,
        request("GET", &format!("/admin/activities/{id}"), Some(ADMIN), None),
    )
    .await;
    assert_eq!(detail["stats"]["redisStock"], Value::Null);
    assert_eq!(detail["stats"]["drift"], Value::Null);
    assert_eq!(detail["stats"]["dbRemaining"], json!(0));
    Ok(())
}

async fn a_failed_db_write_gives_redis_its_units_back(kind: RedisKind) -> anyhow::Result<()> {
    // Arrange: a running sale, and a database that refuses one particular update (a real
    // failure inside the transaction, after Redis was already lowered).
    let (env, state) = setup(kind, 2000, 1000).await;
    let a = env.open_activity(20, 1).await?;
    for stmt in [
        "create function refuse_13() returns trigger language plpgsql as $$
         begin
           if new.total_stock = 13 then raise exception 'refused by test trigger'; end if;
           return new;
         end $$",
        "create trigger refuse_13 before update on activities
         for each row execute function refuse_13()",
    ] {
        sqlx::query(stmt).execute(&env.pool).await?;
    }

    // Act: lower 20 -> 13 (Redis first, then the DB fails).
    let err = update_activity(&state, a.id, &patch(json!({"totalStock": 13})))
        .await
        .unwrap_err();

    // Assert: an error, and both stores are as before: Redis got its 7 units back.
    assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR, "{err}");
    let row = db_activity(&env, a.id).await;
    assert_eq!((row.total_stock, row.config_version), (20, 1));
    assert_eq!(redis_stock(&env, a.id).await, Some(20));
    let total: String = env
        .redis
        .cmd(
            redis::cmd("HGET")
                .arg(env.redis.keys(a.id).meta)
                .arg("total"),
        )
        .await?;
    assert_eq!(total, "20");
    // And the next change goes through normally.
    update_activity(&state, a.id, &patch(json!({"totalStock": 12}))).await?;
    assert_eq!(redis_stock(&env, a.id).await, Some(12));
    Ok(())
}

/// A sale's detail (`GET /admin/activities/{id}`, the operator page's chart) reads a bucket's
/// ledger of more than one step's entries by HSCAN: the admin function, logged in as its own
/// Redis user, may.
async fn a_sales_detail_reads_a_ledger_larger_than_one_step(kind: RedisKind) -> anyhow::Result<()> {
    let (env, _) = setup(kind, 5_000, 1_000).await;
    let pending = ledger::LEDGER_INLINE + 20;
    let a = env.open_activity(pending as i64 + 10, 1).await?;
    let far = purchase::far_deadline();
    for i in 0..pending {
        let user = format!("u{i}");
        let reserved = testkit::purchase(&env.redis, a.id, &user, 1, Uuid::now_v7(), far).await?;
        assert!(reserved.is_ok(), "{reserved:?}");
    }

    let (status, shown) = call(
        &env.admin_router(),
        request(
            "GET",
            &format!("/admin/activities/{}", a.id),
            Some(ADMIN),
            None,
        ),
    )
    .await;

    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["stats"]["pendingCount"], json!(pending), "{shown}");
    Ok(())
}
on_every_redis!(a_sales_detail_reads_a_ledger_larger_than_one_step);
