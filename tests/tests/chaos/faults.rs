//! Faults of the services: the private Redis paused, a sale's keys lost (once, and a draw sale's
//! again after its draw), one buyer's field in `users` lost while the sale stays loaded.

use crate::world::Chaos;
use anyhow::Context as _;
use rand::seq::IndexedRandom;
use rand::RngExt;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::keys::SENTINEL;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// SIGSTOP the private Redis for 0.3-1.5 s at random moments, then SIGCONT.
pub async fn redis_pauses(c: Arc<Chaos>) -> anyhow::Result<()> {
    let Some(private) = &c.private else {
        return Ok(());
    };
    let mut rng = c.rng(800);
    while c.nap(rng.random_range(500..2000)).await {
        let ms = rng.random_range(300..=1500);
        private.signal("-STOP");
        tokio::time::sleep(Duration::from_millis(ms)).await;
        private.signal("-CONT");
        c.count(|r| {
            r.pauses += 1;
            r.paused_ms += ms;
        });
    }
    Ok(())
}

/// Loses the sale's keys once, somewhere in the middle of the phase: FLUSHALL on the private
/// Redis, a DEL of every key of each sale on the shared cluster.
pub async fn key_loss(c: Arc<Chaos>, phase: Duration) -> anyhow::Result<()> {
    let mut rng = c.rng(1000);
    let at = phase.mul_f64(rng.random_range(0.3..0.7));
    if !c.nap(at.as_millis() as u64).await {
        return Ok(());
    }
    match &c.private {
        Some(private) => {
            // A paused server times the call out: try again until it is back (pauses are short).
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let flush = async {
                    let mut con = private.raw().await?;
                    redis::cmd("FLUSHALL").query_async::<()>(&mut con).await
                };
                match tokio::time::timeout(Duration::from_secs(2), flush).await {
                    Ok(Ok(())) => break,
                    _ if Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Ok(Err(e)) => return Err(e).context("FLUSHALL"),
                    Err(_) => anyhow::bail!("FLUSHALL timed out"),
                }
            }
        }
        None => {
            // A bucketed sale may lose one bucket alone (its shard restarted empty).
            let one = rng.random_bool(0.5);
            for &id in &c.activities {
                let all: Vec<Bucket> = c.buckets_of(id).collect();
                let lost = if one && all.len() > 1 {
                    vec![all[rng.random_range(0..all.len())]]
                } else {
                    all
                };
                for bucket in lost {
                    let k = c.patient.redis.bucket_keys(bucket);
                    let _: i64 = c
                        .patient
                        .redis
                        .cmd(
                            redis::cmd("DEL")
                                .arg(&k.meta)
                                .arg(&k.users)
                                .arg(&k.ledger)
                                .arg(&k.lock)
                                .arg(&k.fence)
                                .arg(&k.pool)
                                .arg(&k.winners)
                                .arg(&k.tickets),
                        )
                        .await?;
                }
            }
        }
    }
    c.count(|r| r.keys_lost += 1);
    Ok(())
}

/// Loses each draw sale's keys once more, 0-1.5 s after its draw is done (before its
/// record, between the record and the sends, or during them: reconcile's next run, which
/// records and sends, comes within 0.5-1.5 s): the load that follows finds the recorded
/// outcome (or none, and the draw runs again over the kept entries).
pub async fn draw_key_loss(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(1200);
    let mut left: Vec<i64> = c.draws.keys().copied().collect();
    while !left.is_empty() && c.nap(50).await {
        let mut i = 0;
        while i < left.len() {
            let id = left[i];
            let k = c.patient.redis.keys(id);
            let drawn: Option<String> = c
                .patient
                .redis
                .cmd(redis::cmd("HGET").arg(&k.meta).arg("drawn"))
                .await
                .unwrap_or(None);
            if drawn.as_deref() != Some("1") {
                i += 1;
                continue;
            }
            left.swap_remove(i);
            if !c.nap(rng.random_range(0..1500)).await {
                return Ok(());
            }
            // A paused server times the call out: this loss is skipped then.
            if testkit::lose_activity(&c.patient.redis, id).await.is_ok() {
                c.count(|r| {
                    r.keys_lost += 1;
                    r.draw_keys_lost += 1;
                });
            }
        }
    }
    Ok(())
}

/// Loses a buyer's field in `users` every 0.3-1.2 s while the sale stays loaded, as a
/// failover that dropped the last writes leaves it: a random user of a random bucket's
/// `users`, when no entry of hers is in flight. Reconcile restores it from her live order,
/// and her cancel restores it itself; a field with no live order behind it stays gone.
pub async fn lost_fields(c: Arc<Chaos>) -> anyhow::Result<()> {
    let mut rng = c.rng(1100);
    while c.nap(rng.random_range(300..1200)).await {
        let id = c.pick_activity(&mut rng);
        let all: Vec<Bucket> = c.buckets_of(id).collect();
        let bucket = all[rng.random_range(0..all.len())];
        let k = c.patient.redis.bucket_keys(bucket);
        // A paused Redis may time the read out: the next round tries again.
        let Ok(users) = c
            .patient
            .redis
            .cmd::<Vec<String>>(redis::cmd("HKEYS").arg(&k.users))
            .await
        else {
            continue;
        };
        let users: Vec<&String> = users.iter().filter(|u| *u != SENTINEL).collect();
        let Some(user) = users.choose(&mut rng) else {
            continue;
        };
        if let Ok(true) = testkit::lose_field(&c.patient.redis, bucket, user).await {
            c.count(|r| r.fields_lost += 1);
        }
    }
    Ok(())
}
