//! Quiescence: the draws finished and their winners sent as reconcile's draw part does, the
//! queue drained without faults, the final reconcile passes, the give-backs awaited; and a
//! passed seed's database and queue dropped.

use crate::world::{Chaos, Delivery};
use crate::{
    finishes, CLEAN_UP_STEP_LIMIT, DRAIN_LIMIT, FINAL_RECONCILES, GIVE_BACK_WAIT, SQS_CALL_LIMIT,
};
use anyhow::Context as _;
use aws_sdk_sqs::types::QueueAttributeName;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_shared::infra::shape::Function;
use seckill_shared::protocol;
use seckill_shared::store::draw::Drawn;
use sqlx::{Connection, PgConnection};
use std::time::{Duration, Instant};

impl Chaos {
    /// Consumes until the queues (the orders', the entries') hold nothing, visible or in
    /// flight (a dead consumer's batch comes back after the visibility timeout), with no
    /// faults.
    pub async fn drain_queue(&self) -> anyhow::Result<()> {
        let consumer = self.consumer();
        let started = Instant::now();
        let urls = self.env.queue_urls();
        let mut quiet_polls = 0;
        for turn in 0.. {
            if quiet_polls >= 2 * urls.len() {
                break;
            }
            let url = &urls[turn % urls.len()];
            if started.elapsed() > DRAIN_LIMIT {
                let depth = queue_depth(&self.env.sqs, url).await?;
                self.violate(
                    "queue_drained",
                    None,
                    format!("{url}: (visible, in flight) messages {depth:?} after {DRAIN_LIMIT:?}"),
                );
                break;
            }
            let messages = self.receive(url).await?;
            if messages.is_empty() {
                let (visible, in_flight) = queue_depth(&self.env.sqs, url).await?;
                quiet_polls = if visible + in_flight == 0 {
                    quiet_polls + 1
                } else {
                    0
                };
                continue;
            }
            quiet_polls = 0;
            self.deliver(&consumer, url, &messages, Delivery::Once, Duration::ZERO)
                .await;
            self.count(|r| r.drain_batches += 1);
        }
        let dlq = queue_depth(&self.env.sqs, &testkit::dlq_url(&self.env.queue.url)).await?;
        self.count(|r| {
            r.drain_secs = started.elapsed().as_secs_f64();
            r.dlq = dlq.0 + dlq.1;
        });
        Ok(())
    }

    /// What reconcile's draw part does for each draw sale once the actors stop (with reconcile
    /// off, it stands in for the runs that would come: no request draws): the draw run if
    /// nobody finished it, recorded, and its winners' orders written (a run that fails is
    /// tried again, as the next one would). Bounded: what is left shows in the checks.
    pub async fn finish_draws(&self) {
        // As reconcile runs it: its database role and Redis user.
        let (db, redis) = self.patient.login(Function::Reconcile);
        let entries = self.env.queues().entries;
        for &id in self.draws.keys() {
            let until = Instant::now() + DRAIN_LIMIT;
            while Instant::now() < until {
                let done = async {
                    let run = protocol::draw::drive(
                        &redis,
                        &db,
                        &entries,
                        id,
                        Instant::now() + Duration::from_secs(5),
                        self.patient.config.draw_entry_wait,
                    )
                    .await?;
                    if matches!(run.drawn, Drawn::Open { .. }) {
                        return anyhow::Ok(false);
                    }
                    Ok(run.drawn.is_done() && (run.written || run.diverged))
                };
                match done.await {
                    Ok(true) => break,
                    Ok(false) => tokio::time::sleep(Duration::from_millis(100)).await,
                    Err(e) => {
                        self.violate("harness", Some(id), format!("finishing the draw: {e:#}"));
                        break;
                    }
                }
            }
        }
    }

    /// Reconcile passes past the grace period of everything done so far.
    pub async fn final_reconcile(&self) -> anyhow::Result<()> {
        let job = self.patient.reconcile();
        let grace = ChronoDuration::from_std(self.patient.config.reconcile_grace)?;
        for _ in 0..FINAL_RECONCILES {
            let outcome = job
                .run(Utc::now() + grace + ChronoDuration::seconds(1))
                .await;
            if let Err(e) = &outcome {
                self.violate("harness", None, format!("final reconcile failed: {e:#}"));
            }
            self.count_reconcile(&outcome);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Gives a reservation behind a 503 a few seconds to be given back (no reconcile needed).
    pub async fn wait_for_give_backs(&self) -> anyhow::Result<()> {
        let until = Instant::now() + GIVE_BACK_WAIT;
        loop {
            let mut busy = false;
            for &id in &self.activities {
                for (_, snap) in self.snapshots(id).await? {
                    busy |= !snap.ledger.is_empty();
                }
            }
            if !busy || Instant::now() >= until {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
async fn queue_depth(sqs: &aws_sdk_sqs::Client, url: &str) -> anyhow::Result<(u64, u64)> {
    let read_attrs = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send();
    let attrs = tokio::time::timeout(SQS_CALL_LIMIT, read_attrs)
        .await
        .context("queue attributes timed out")?
        .context("queue attributes")?;
    let read = |name: &QueueAttributeName| {
        attrs
            .attributes()
            .and_then(|a| a.get(name))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((
        read(&QueueAttributeName::ApproximateNumberOfMessages),
        read(&QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    ))
}

pub async fn delete_queue(sqs: &aws_sdk_sqs::Client, url: &str) {
    for u in [
        url.to_string(),
        testkit::entries_url(url),
        testkit::dlq_url(url),
    ] {
        let _ = sqs.delete_queue().queue_url(u).send().await;
    }
}

impl Chaos {
    /// A passed seed's database and queue are dropped (a long campaign would pile them up);
    /// a failed seed's are kept for a look. Each step is bounded, and one that does not finish
    /// is a finding that names it: closing the pool waits for every connection to come back,
    /// so a connection something still holds after quiescence shows here, with the pool's
    /// count of those not handed back.
    pub async fn clean_up(&self, passed: bool) -> Vec<String> {
        if !passed {
            println!(
                "seed={} [{}]: kept database {} and queue {} for a look",
                self.seed,
                self.variant,
                self.env.config.database_url.redacted(),
                self.env.queue.url
            );
            return Vec::new();
        }
        let mut findings = Vec::new();
        let mut bounded = |step: &str, done: bool| {
            if !done {
                findings.push(format!(
                    "seed={} [{}] clean-up: {step} did not finish within {CLEAN_UP_STEP_LIMIT:?}",
                    self.seed, self.variant
                ));
            }
        };
        let queue = delete_queue(&self.env.sqs, &self.env.queue.url);
        bounded("deleting the queue", finishes(queue).await);
        let pool = &self.env.pool;
        let closing = finishes(pool.close()).await;
        let held = pool.size() as usize - pool.num_idle();
        bounded(
            &format!("closing the pool ({held} connection(s) not handed back)"),
            closing,
        );
        match tokio::time::timeout(
            CLEAN_UP_STEP_LIMIT,
            drop_database(self.env.config.database_url.expose()),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => println!("seed={}: could not drop its database: {e:#}", self.seed),
            Err(_) => bounded("dropping the database", false),
        }
        findings
    }
}
async fn drop_database(url: &str) -> anyhow::Result<()> {
    let (base, rest) = url.rsplit_once('/').context("a database url")?;
    let (name, query) = match rest.split_once('?') {
        Some((name, query)) => (name, format!("?{query}")),
        None => (rest, String::new()),
    };
    anyhow::ensure!(
        name.starts_with("seckill_test_")
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "not a test database: {name}"
    );
    let mut admin = PgConnection::connect(&format!("{base}/postgres{query}")).await?;
    // A database name cannot be a bind parameter: the statement is built at runtime, which
    // `sqlx::query!` (a checked literal) cannot take.
    // The name is a test database's (checked above), never user input.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {name} with (force)"
    )))
    .execute(&mut admin)
    .await?;
    admin.close().await?;
    Ok(())
}
