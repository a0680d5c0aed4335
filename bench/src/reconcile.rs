//! Reconcile at real size: one sale whose ledger holds N reservations (entered through
//! `lua/purchase.lua`), the first half older than the grace period with no order (each one a
//! row to repair: claimed and given back), the second half young. Then one reconcile run, as
//! the scheduled job runs it (its default budget), on a database of its own so no other
//! section's sale shares the run, while a connection of its own PINGs the server about every
//! millisecond. Beside it, on the same keys: the whole-ledger snapshot the chunked read
//! replaced (`bench/scripts/snapshot_whole_ledger.lua`). Every call's server time comes from
//! the slow log (threshold 0 for the baseline; for the run, every call slower than 100 µs).

use crate::draw::SlowLog;
use crate::util;
use reconcile::Reconcile;
use redis::aio::MultiplexedConnection;
use seckill_shared::domain::activity;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::protocol::load;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::Bucket;
use seckill_shared::store::purchase;
use seckill_shared::Context;
use serde::Serialize;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The whole-ledger snapshot this section compares against.
const WHOLE_LEDGER: &str = include_str!("../scripts/snapshot_whole_ledger.lua");

/// The slow log's threshold during the run: the calls slower than this are each recorded.
const RUN_THRESHOLD_US: u64 = 100;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileRow {
    /// Reservations in the ledger, and how many of them are stale with no order.
    pub ledger: usize,
    pub stale: usize,
    /// `one run` (the reconcile job) or `whole-ledger snapshot` (the baseline, one script).
    pub what: &'static str,
    /// Wall clock, ms.
    pub ms: f64,
    /// Stale reservations given back, and whether the run's budget ended its walk first.
    pub given_back: usize,
    pub out_of_time: bool,
    /// The longest single Redis call (server µs, the slow log) and its command.
    pub longest_call_us: u64,
    pub longest_call: String,
    /// PINGs answered meanwhile, and the slowest, ms.
    pub pings: u64,
    pub ping_max_ms: f64,
}

pub struct Sizes {
    pub ledger: usize,
    pub concurrency: usize,
}

pub async fn run(client: &redis::Client, sizes: &Sizes) -> anyhow::Result<Vec<ReconcileRow>> {
    let (database_url, pool) = testkit::fresh_database().await?;
    let mut admin = client.get_multiplexed_async_connection().await?;
    admin.set_response_timeout(Duration::from_secs(120));
    let mut config = testkit::config(&database_url, testkit::RedisKind::Standalone);
    config.key_prefix = util::fresh_prefix();
    config.redis_timeout = Duration::from_secs(30);
    let defaults = seckill_shared::Config::from_env()?;
    config.reconcile_budget = defaults.reconcile_budget;
    config.db_max_connections = 4;
    let redis = Redis::connect(&config).await?;
    let result = async {
        let n = sizes.ledger;
        let now = chrono::Utc::now();
        let activity = activity::insert(
            &pool,
            &testkit::new_activity()
                .title(format!("bench reconcile {n}"))
                .stock(n as i64 + 10)
                .limit(1)
                .window(
                    now - chrono::Duration::seconds(1),
                    now + chrono::Duration::hours(1),
                )
                .rate(0)
                .build()
                .settings()?,
        )
        .await?;
        load::load_under_lock(
            &redis,
            &pool,
            &config,
            activity.id,
            std::time::Instant::now() + std::time::Duration::from_secs(60),
        )
        .await?;
        let stale = n / 2;
        eprintln!(
            "  {n} reservations ({stale} to become stale): entering through purchase.lua ..."
        );
        reserve(&redis, activity.id, 0, stale, sizes.concurrency).await;
        let stale_until = chrono::Utc::now();
        tokio::time::sleep(Duration::from_millis(20)).await;
        reserve(&redis, activity.id, stale, n - stale, sizes.concurrency).await;
        // A moment past the grace period of every entry of the first half, and of none of the
        // second half's.
        let at = stale_until
            + chrono::Duration::from_std(config.reconcile_grace)?
            + chrono::Duration::milliseconds(5);

        let mut rows = Vec::new();
        let k = redis.keys(activity.id);
        let script = redis::Script::new(WHOLE_LEDGER);
        let mut con = client.get_multiplexed_async_connection().await?;
        con.set_response_timeout(Duration::from_secs(120));
        let m = measure(client, &mut admin, 0, || async {
            let _: redis::Value = script
                .key(&k.meta)
                .key(&k.users)
                .key(&k.ledger)
                .key(&k.winners)
                .invoke_async(&mut con)
                .await?;
            anyhow::Ok((0, false))
        })
        .await?;
        rows.push(row(n, stale, "whole-ledger snapshot", m));

        let job = Reconcile::new(Context::new(config.clone(), pool.clone(), redis.clone()));
        let m = measure(client, &mut admin, RUN_THRESHOLD_US, || async {
            let report = job.run(at).await?;
            let r = report
                .activity(activity.id)
                .ok_or_else(|| anyhow::anyhow!("the run did not check the sale: {report:?}"))?;
            anyhow::Ok((r.compensated, r.out_of_time))
        })
        .await?;
        rows.push(row(n, stale, "one run", m));
        anyhow::Ok(rows)
    }
    .await;
    let _ = util::delete_prefix(&mut admin, &config.key_prefix).await;
    pool.close().await;
    if let Err(e) = crate::util::drop_database(&database_url).await {
        eprintln!("could not drop the reconcile section's database: {e}");
    }
    result
}

/// `count` reservations of one unit each, users `from..from + count`.
async fn reserve(redis: &Redis, id: i64, from: usize, count: usize, concurrency: usize) {
    let redis = redis.clone();
    let run = util::run_tasks(concurrency, count, move |i| {
        let redis = redis.clone();
        async move {
            let attempt = Attempt {
                request_id: Uuid::now_v7(),
                activity_id: id,
                user_id: format!("buyer-{:07}", from + i),
                quantity: 1,
                buckets: 1,
            };
            let home = Bucket::from(id);
            match purchase::run(&redis, home, &attempt, purchase::far_deadline(), &[]).await {
                Ok((purchase::Answer::Accepted(_), _)) => util::Outcome::Sold,
                Ok((other, _)) => util::Outcome::Error(format!("answered {other:?}")),
                Err(e) => util::Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    run.warn_errors("reconcile section's reservations");
}

/// What one measured step cost.
struct Measured {
    ms: f64,
    given_back: usize,
    out_of_time: bool,
    longest_us: u64,
    longest: String,
    pings: u64,
    ping_max_ms: f64,
}

fn row(ledger: usize, stale: usize, what: &'static str, m: Measured) -> ReconcileRow {
    let r = ReconcileRow {
        ledger,
        stale,
        what,
        ms: m.ms,
        given_back: m.given_back,
        out_of_time: m.out_of_time,
        longest_call_us: m.longest_us,
        longest_call: m.longest,
        pings: m.pings,
        ping_max_ms: m.ping_max_ms,
    };
    eprintln!(
        "  {ledger} reservations, {what}: {:.0} ms, {} given back{}, longest call {} µs ({}), \
         PING max {:.2} ms over {}",
        r.ms,
        r.given_back,
        if r.out_of_time { " (budget spent)" } else { "" },
        r.longest_call_us,
        r.longest_call,
        r.ping_max_ms,
        r.pings
    );
    r
}

/// Runs `step` with the slow log set to `threshold_us` and a PING loop beside it.
async fn measure<F, Fut>(
    client: &redis::Client,
    admin: &mut MultiplexedConnection,
    threshold_us: u64,
    step: F,
) -> anyhow::Result<Measured>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(usize, bool)>>,
{
    let slowlog = SlowLog::open_at(admin, threshold_us).await?;
    let pinger = util::Pinger::start(client).await?;
    let started = Instant::now();
    let outcome = step().await;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let (pings, ping_max_ms) = pinger.stop().await?;
    let slowest = slowlog.slowest(admin).await;
    slowlog.close(admin).await;
    let (given_back, out_of_time) = outcome?;
    let (longest_us, longest) = slowest?
        .into_iter()
        .filter(|(_, command)| command != "ping")
        .max()
        .unwrap_or((0, format!("none over {threshold_us} µs")));
    Ok(Measured {
        ms,
        given_back,
        out_of_time,
        longest_us,
        longest,
        pings,
        ping_max_ms,
    })
}
