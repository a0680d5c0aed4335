//! The re-entrant admin lock against real Redis (standalone and cluster) and real PostgreSQL:
//! nested holds keep the lock until the last release under one fencing token, a non-owner's
//! release changes nothing, the hold count survives the watchdog's renewals, and a paused
//! holder's nested release after its lease ran out leaves the next holder's lock alone while
//! the database refuses its token. The outermost release ends the lock even when Redis counts
//! a hold the holder never knew of, and a nested release delivered twice never ends it.

use seckill_shared::domain::activity;
use seckill_shared::protocol::lock;
use seckill_shared::protocol::lock::LockError;
use seckill_shared::store::scripts;
use std::time::Duration;
use testkit::on_every_redis;
use testkit::LockHold;
use testkit::RedisKind;
use testkit::TestEnv;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A test env and an activity row (not loaded into Redis: the lock is all these tests use).
async fn setup(kind: RedisKind) -> anyhow::Result<(TestEnv, i64)> {
    let env = TestEnv::new(kind).await?;
    let a = activity::insert(
        &env.pool,
        &testkit::new_activity()
            .title("lock test")
            .stock(10)
            .limit(1)
            .build()
            .settings()?,
    )
    .await?;
    Ok((env, a.id))
}

fn hold(owner: &str, holds: i64, token: i64) -> Option<LockHold> {
    Some(LockHold {
        owner: owner.to_string(),
        holds,
        token,
    })
}

async fn fence_counter(env: &TestEnv, id: i64) -> anyhow::Result<Option<i64>> {
    Ok(env
        .redis
        .cmd(redis::cmd("GET").arg(env.redis.keys(id).fence))
        .await?)
}

/// A fenced database write with `token`, committed when the fence accepts it.
async fn fenced_write(env: &TestEnv, id: i64, token: i64) -> Result<(), LockError> {
    let mut tx = env.pool.begin().await?;
    lock::fenced_update(&mut tx, id, token).await?;
    tx.commit().await?;
    Ok(())
}

async fn is_busy(env: &TestEnv, id: i64) -> bool {
    matches!(
        lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(50)).await,
        Err(LockError::Busy)
    )
}

async fn nested_holds_keep_the_lock_until_the_last_release_under_one_token(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: an outer hold and two nested ones.
    let (env, id) = setup(kind).await?;
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    let issued = fence_counter(&env, id).await?;
    let first = outer.reenter().await?;
    let second = first.reenter().await?;

    // Assert: one holder, three holds, the outermost token and no new one issued.
    assert_eq!((first.token, second.token), (outer.token, outer.token));
    assert_eq!((&first.owner, &second.owner), (&outer.owner, &outer.owner));
    let owner = outer.owner.clone();
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 3, outer.token)
    );
    assert_eq!(fence_counter(&env, id).await?, issued);
    assert!(is_busy(&env, id).await);

    // Act + Assert: each nested release gives back one hold; the key stays with the outer one.
    assert!(second.release().await?);
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 2, outer.token)
    );
    assert!(first.release().await?);
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 1, outer.token)
    );
    assert!(is_busy(&env, id).await);
    fenced_write(&env, id, outer.token).await?;

    // The outermost release works as before: the lock goes, the next holder gets a new token.
    let token = outer.token;
    assert!(outer.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);
    let next = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    assert!(next.token > token, "{} > {token}", next.token);
    assert!(next.release().await?);
    Ok(())
}
on_every_redis!(nested_holds_keep_the_lock_until_the_last_release_under_one_token);

async fn nested_guards_dropped_unreleased_are_given_back_by_the_outermost_release(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let (env, id) = setup(kind).await?;

    // A nested guard dropped (an early `?` in a helper) leaves its hold to the outer guard,
    // whose release still deletes the key.
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    let _ = outer.reenter().await?;
    let _ = outer.reenter().await?;
    let owner = outer.owner.clone();
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 3, outer.token)
    );
    assert!(outer.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);

    // The same when the outer guard is dropped too: its background release gives back all.
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    let _ = outer.reenter().await?;
    drop(outer);
    let mut gone = false;
    for _ in 0..100 {
        if testkit::lock_hold(&env.redis, id).await?.is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    assert!(
        gone,
        "the dropped guards' holds were given back well before the lease ran out"
    );
    Ok(())
}
on_every_redis!(nested_guards_dropped_unreleased_are_given_back_by_the_outermost_release);

/// `lua/lock_acquire.lua` re-entering for `owner` as a script whose answer never came back
/// would: Redis counts a hold the guard does not know of.
async fn reenter_unanswered(env: &TestEnv, id: i64, owner: &str) -> anyhow::Result<()> {
    let k = env.redis.keys(id);
    let mut inv = scripts::LOCK_ACQUIRE.prepare_invoke();
    inv.key(&k.lock)
        .key(&k.fence)
        .arg(owner)
        .arg(5000)
        .arg(0)
        .arg("reenter");
    let token: i64 = env.redis.script(&inv).await?;
    anyhow::ensure!(token > 0, "the re-entry was refused");
    Ok(())
}

async fn an_outermost_release_ends_the_lock_even_with_a_hold_nobody_knows_of(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: the holder re-entered, and the answer was lost (or the script ran twice).
    let (env, id) = setup(kind).await?;
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    let owner = outer.owner.clone();
    reenter_unanswered(&env, id, &owner).await?;
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 2, outer.token)
    );

    // Act: the holder is done.
    assert!(outer.release().await?);

    // Assert: the lock is gone at once, not left behind until its lease runs out.
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);
    assert!(!is_busy(&env, id).await);
    Ok(())
}
on_every_redis!(an_outermost_release_ends_the_lock_even_with_a_hold_nobody_knows_of);

async fn a_nested_release_delivered_twice_leaves_the_outer_hold(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: an outer hold and a nested one, released.
    let (env, id) = setup(kind).await?;
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    let owner = outer.owner.clone();
    assert!(outer.reenter().await?.release().await?);

    // Act: the same nested release arrives a second time.
    let mut inv = scripts::LOCK_RELEASE.prepare_invoke();
    inv.key(env.redis.keys(id).lock).arg(&owner).arg("one");
    let answer: i64 = env.redis.script(&inv).await?;

    // Assert: the outer holder still holds the lock it works under.
    assert_eq!(answer, 2, "a nested release never ends the lock");
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 1, outer.token)
    );
    assert!(is_busy(&env, id).await);
    assert!(outer.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);
    Ok(())
}
on_every_redis!(a_nested_release_delivered_twice_leaves_the_outer_hold);

async fn a_release_without_a_mode_is_an_error_and_keeps_every_hold(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: the lock held twice by one owner.
    let (env, id) = setup(kind).await?;
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    let nested = outer.reenter().await?;
    let before = testkit::lock_hold(&env.redis, id).await?;
    assert_eq!(before, hold(&outer.owner, 2, outer.token));

    // Act: the owner's release script called with no mode, and with one it does not know.
    for mode in [None, Some("ALL"), Some("")] {
        let mut inv = scripts::LOCK_RELEASE.prepare_invoke();
        inv.key(env.redis.keys(id).lock).arg(&outer.owner);
        if let Some(mode) = mode {
            inv.arg(mode);
        }
        let answer = env.redis.script::<i64>(&inv).await;

        // Assert: refused as an error, not read as either release.
        let error = answer.expect_err("a release with no known mode must be refused");
        assert!(
            error.to_string().contains("mode must be"),
            "{mode:?}: {error}"
        );
        assert_eq!(testkit::lock_hold(&env.redis, id).await?, before);
    }
    assert!(nested.release().await?);
    assert!(outer.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);
    Ok(())
}
on_every_redis!(a_release_without_a_mode_is_an_error_and_keeps_every_hold);

async fn a_release_by_a_non_owner_changes_nothing(kind: RedisKind) -> anyhow::Result<()> {
    // Arrange: the lock held twice.
    let (env, id) = setup(kind).await?;
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(100)).await?;
    let nested = outer.reenter().await?;
    let before = testkit::lock_hold(&env.redis, id).await?;
    assert_eq!(before, hold(&outer.owner, 2, outer.token));

    // Act: releases by owners that do not hold it, once and repeatedly.
    for stranger in ["someone-else", &uuid::Uuid::new_v4().to_string()] {
        for _ in 0..3 {
            assert!(!lock::release_owned(&env.redis, id, stranger).await?);
        }
    }

    // Assert: not one hold given back, the lease untouched, the holder still the only one.
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, before);
    assert!(is_busy(&env, id).await);
    assert!(nested.release().await?);
    assert!(outer.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);
    Ok(())
}
on_every_redis!(a_release_by_a_non_owner_changes_nothing);

async fn the_hold_count_survives_renewals(kind: RedisKind) -> anyhow::Result<()> {
    // Arrange: a 300 ms lease (renewed every 100 ms), held twice.
    let (env, id) = setup(kind).await?;
    let outer = lock::acquire(&env.redis, &env.pool, id, ms(300), ms(100)).await?;
    let nested = outer.reenter().await?;
    let owner = outer.owner.clone();

    // Act: three lease lengths pass; only the watchdog's renewals keep the lock.
    tokio::time::sleep(ms(900)).await;

    // Assert: still held, both holds counted.
    assert!(!outer.is_lost());
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 2, outer.token)
    );

    // The nested release leaves one hold, which the renewals keep alive in turn.
    assert!(nested.release().await?);
    tokio::time::sleep(ms(600)).await;
    assert!(!outer.is_lost());
    assert_eq!(
        testkit::lock_hold(&env.redis, id).await?,
        hold(&owner, 1, outer.token)
    );
    assert!(outer.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);
    Ok(())
}
on_every_redis!(the_hold_count_survives_renewals);

async fn a_paused_holders_nested_release_after_its_lease_expired_leaves_the_next_holder_alone(
    kind: RedisKind,
) -> anyhow::Result<()> {
    // Arrange: A holds the lock twice with a 300 ms lease, then "pauses": nothing renews it.
    let (env, id) = setup(kind).await?;
    let mut a = lock::acquire(&env.redis, &env.pool, id, ms(300), ms(100)).await?;
    a.stop_watchdog();
    let a_nested = a.reenter().await?;
    tokio::time::sleep(ms(450)).await;
    assert!(a.is_lost(), "A's lease ran out while it was paused");

    // A re-entry after the lease ran out does not take the free lock with A's old token.
    assert!(matches!(a.reenter().await, Err(LockError::Lost)));
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);

    // B takes the lock and writes.
    let b = lock::acquire(&env.redis, &env.pool, id, ms(5000), ms(1000)).await?;
    assert!(b.token > a.token);
    fenced_write(&env, id, b.token).await?;
    let b_holds = hold(&b.owner, 1, b.token);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, b_holds);

    // Act: A resumes, unaware, and releases its nested hold, then tries its fenced write.
    let nested_ours = a_nested.release().await?;
    let a_token = a.token;
    let write = fenced_write(&env, id, a_token).await;

    // Assert: B's lock is untouched (not decremented, not deleted), A's write is refused.
    assert!(!nested_ours);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, b_holds);
    assert!(
        matches!(write, Err(LockError::StaleToken { token, seen }) if token == a_token && seen == b.token),
        "{write:?}"
    );
    assert!(!a.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, b_holds);
    assert!(b.release().await?);
    assert_eq!(testkit::lock_hold(&env.redis, id).await?, None);
    Ok(())
}
on_every_redis!(
    a_paused_holders_nested_release_after_its_lease_expired_leaves_the_next_holder_alone
);
