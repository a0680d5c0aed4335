//! The draw at real size. For each size: a draw sale loaded as preheat loads it, N entrants
//! entered through `lua/purchase.lua` (their tickets made there), the window closed, then the
//! draw run in its steps (`lua/draw.lua`, `store::draw::draw`) while a connection of its own
//! PINGs the same server about every millisecond. Side by side on a copy of the same pool
//! (`COPY`, before the draw): the whole-pool draw the steps replaced
//! (`bench/scripts/draw_whole_pool.lua`). Each script's server time is read from the slow log
//! (its threshold set to 0 for the draw only, then put back); memory is `MEMORY USAGE` of the
//! pool and the tickets after the entries. Then the same pool lost with the sale's keys and
//! put back from the database (`rebuild`): N entries kept in `draw_entries` as the consumer
//! keeps them, the sale loaded from scratch (the load's share of the rebuild) and the rest
//! rebuilt as reconcile goes on: database reads of `protocol::draw::REBUILD_CHUNK` entries,
//! `lua/pool_restore.lua` calls of `RESTORE_CALL`, with the PING loop beside it.

use crate::util;
use redis::aio::MultiplexedConnection;
use seckill_shared::domain::activity;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::domain::settings::MAX_DRAW_WINDOW_MS;
use seckill_shared::infra::config::Config;
use seckill_shared::protocol::draw as drawing;
use seckill_shared::protocol::load;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::draw::{self, Drawn};
use seckill_shared::store::purchase;
use serde::Serialize;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// The stock of every draw sale here (one unit per entrant).
pub const STOCK: i64 = 1_000;

/// The whole-pool draw this section compares against.
const WHOLE_POOL: &str = include_str!("../scripts/draw_whole_pool.lua");

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrawRow {
    pub entrants: usize,
    /// `steps` (lua/draw.lua), `whole pool` (the baseline), `rebuild` (the pool put back
    /// from the database) or `drawer` (reconcile's whole part: the steps, the record and the
    /// winners' orders, with a tenth of the entrants in units).
    pub draw: &'static str,
    pub stock: i64,
    /// Script calls the draw took.
    pub calls: usize,
    pub winners: i64,
    /// The longest single call, server time (the slow log), µs: of the row's script, or for
    /// the drawer of any command.
    pub longest_script_us: u64,
    /// That call's script file, or its command.
    pub longest_call: String,
    /// The drawer's longest database transaction (the record, or a chunk of orders with its
    /// settle), wall clock, ms; its longest statement is no longer.
    pub longest_transaction_ms: Option<f64>,
    /// The whole draw, wall clock, ms.
    pub draw_ms: f64,
    /// PINGs answered while the draw ran, and the slowest of them, ms.
    pub pings: u64,
    pub ping_max_ms: f64,
    /// Entering the pool: entrants per second through lua/purchase.lua (64 tasks).
    pub entries_per_sec: f64,
    /// MEMORY USAGE of the pool hash and the tickets sorted set, per entrant, bytes.
    pub bytes_per_entrant: f64,
}

pub struct Sizes {
    pub entrants: Vec<usize>,
    /// The largest size the whole-pool baseline still runs at (it blocks the server for
    /// seconds beyond).
    pub baseline_max: usize,
    pub concurrency: usize,
}

pub async fn run(
    client: &redis::Client,
    database_url: &str,
    pool: &PgPool,
    sizes: &Sizes,
) -> anyhow::Result<Vec<DrawRow>> {
    let mut admin = client.get_multiplexed_async_connection().await?;
    // MEMORY USAGE and COPY of a 1M-member key take a while on a busy machine.
    admin.set_response_timeout(Duration::from_secs(120));
    let mut config = testkit::config(database_url, testkit::RedisKind::Standalone);
    config.key_prefix = util::fresh_prefix();
    config.redis_timeout = Duration::from_secs(30);
    let redis = Redis::connect(&config).await?;
    let mut rows = Vec::new();
    let result = async {
        for &n in &sizes.entrants {
            rows.extend(one_size(client, &mut admin, &config, &redis, pool, n, sizes).await?);
        }
        anyhow::Ok(())
    }
    .await;
    util::delete_prefix(&mut admin, &config.key_prefix).await?;
    result.map(|()| rows)
}

async fn one_size(
    client: &redis::Client,
    admin: &mut MultiplexedConnection,
    config: &Config,
    redis: &Redis,
    pool: &PgPool,
    n: usize,
    sizes: &Sizes,
) -> anyhow::Result<Vec<DrawRow>> {
    let now = chrono::Utc::now();
    let activity = activity::insert(
        pool,
        &testkit::new_activity()
            .title(format!("bench draw {n}"))
            .stock(STOCK)
            .limit(1)
            .window(
                now - chrono::Duration::seconds(1),
                now + chrono::Duration::hours(1),
            )
            .draw(MAX_DRAW_WINDOW_MS)
            .rate(0)
            .build()
            .settings()?,
    )
    .await?;
    load::load_under_lock(
        redis,
        pool,
        config,
        activity.id,
        std::time::Instant::now() + std::time::Duration::from_secs(60),
    )
    .await?;
    eprintln!("  {n} entrants: entering through purchase.lua ...");
    let entered = {
        let redis = redis.clone();
        let id = activity.id;
        util::run_tasks(sizes.concurrency, n, move |i| {
            let redis = redis.clone();
            async move {
                let attempt = Attempt {
                    request_id: Uuid::now_v7(),
                    activity_id: id,
                    user_id: format!("entrant-{i:07}"),
                    quantity: 1,
                    buckets: 1,
                };
                let home = seckill_shared::store::keys::Bucket::from(id);
                match purchase::run(&redis, home, &attempt, purchase::far_deadline(), &[]).await {
                    Ok((purchase::Answer::Queued { .. }, _)) => util::Outcome::Sold,
                    Ok((other, _)) => util::Outcome::Error(format!("entered as {other:?}")),
                    Err(e) => util::Outcome::Error(e.to_string()),
                }
            }
        })
        .await
    };
    entered.warn_errors("draw entries");
    let k = redis.keys(activity.id);
    let usage = |key: &str| {
        let mut c = redis::cmd("MEMORY");
        c.arg("USAGE").arg(key).arg("SAMPLES").arg(0);
        c
    };
    let pool_bytes: u64 = usage(&k.pool).query_async(admin).await?;
    let ticket_bytes: u64 = usage(&k.tickets).query_async(admin).await?;
    let bytes_per_entrant = (pool_bytes + ticket_bytes) as f64 / n as f64;
    close_window(admin, &k.meta).await?;

    let mut rows = Vec::new();
    if n <= sizes.baseline_max {
        // The same pool under another sale's keys (one hash tag: the copies share a slot).
        let twin = redis.keys(activity.id + 1_000_000);
        copy_sale(admin, &k, &twin).await?;
        let script = redis::Script::new(WHOLE_POOL);
        let sha: String = script.prepare_invoke().load_async(admin).await?;
        let mut con = client.get_multiplexed_async_connection().await?;
        // The whole-pool draw of a large pool runs for seconds.
        con.set_response_timeout(Duration::from_secs(120));
        let measured = measure(client, admin, Some(&sha), || async {
            let answer: Vec<i64> = script
                .key(&twin.meta)
                .key(&twin.users)
                .key(&twin.ledger)
                .key(&twin.pool)
                .key(&twin.winners)
                .arg(rand::random::<u32>() >> 1)
                .invoke_async(&mut con)
                .await?;
            anyhow::Ok((1, answer.get(1).copied().unwrap_or(0)))
        })
        .await?;
        rows.push(row(
            n,
            "whole pool",
            measured,
            entered.per_sec(),
            bytes_per_entrant,
        ));
    }

    let sha = seckill_shared::store::scripts::DRAW.get_hash().to_string();
    let measured = measure(client, admin, Some(&sha), || async {
        let mut calls = 0;
        let mut winners = 0;
        loop {
            calls += 1;
            match draw::draw(redis, activity.id, Duration::ZERO).await? {
                Drawn::Running { winners: w, .. } => winners += w,
                Drawn::Now { winners: w, .. } => return anyhow::Ok((calls, winners + w)),
                other => anyhow::bail!("the draw answered {other:?}"),
            }
        }
    })
    .await?;
    rows.push(row(
        n,
        "steps",
        measured,
        entered.per_sec(),
        bytes_per_entrant,
    ));

    let kept = Instant::now();
    sqlx::query(
        "insert into draw_entries (activity_id, user_id, request_id, quantity)
         select $1, 'entrant-' || lpad(i::text, 7, '0'), gen_random_uuid(), 1
         from generate_series(0, $2 - 1) as i",
    )
    .bind(activity.id)
    .bind(n as i64)
    .execute(pool)
    .await?;
    eprintln!(
        "  {n} entries kept in {:.1} s",
        kept.elapsed().as_secs_f64()
    );
    testkit::lose_activity(redis, activity.id).await?;
    let sha = seckill_shared::store::scripts::POOL_RESTORE
        .get_hash()
        .to_string();
    let measured = measure(client, admin, Some(&sha), || async {
        load::load_under_lock(
            redis,
            pool,
            config,
            activity.id,
            std::time::Instant::now() + std::time::Duration::from_secs(60),
        )
        .await?;
        loop {
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            if drawing::rebuild(redis, pool, activity.id, deadline)
                .await?
                .done
            {
                break;
            }
        }
        let put_back: i64 = redis.cmd(redis::cmd("HLEN").arg(&k.pool)).await?;
        anyhow::Ok((n.div_ceil(drawing::RESTORE_CALL), put_back - 1))
    })
    .await?;
    rows.push(row(
        n,
        "rebuild",
        measured,
        entered.per_sec(),
        bytes_per_entrant,
    ));
    rows.extend(nothing_fits(client, admin, config, redis, pool, n, bytes_per_entrant).await?);
    rows.push(
        drawer(
            client,
            admin,
            config,
            redis,
            pool,
            activity.id,
            n,
            &entered,
            bytes_per_entrant,
        )
        .await?,
    );
    Ok(rows)
}

/// The drawer at `n` entrants with a tenth of them in units: the sale's stock raised in the
/// database, the sale lost and loaded again (its pool rebuilt whole, not measured), the window
/// closed; then, measured, what reconcile's draw part does: the draw's steps, the record of
/// its outcome, and the winners' orders chunk by chunk, each chunk's transaction timed.
#[allow(clippy::too_many_arguments)]
async fn drawer(
    client: &redis::Client,
    admin: &mut MultiplexedConnection,
    config: &Config,
    redis: &Redis,
    pool: &PgPool,
    id: i64,
    n: usize,
    entered: &util::Run,
    bytes_per_entrant: f64,
) -> anyhow::Result<DrawRow> {
    let units = (n / 10) as i64;
    sqlx::query(
        "update activities set total_stock = $2::bigint, remaining_stock = $2::bigint where id = $1",
    )
    .bind(id)
    .bind(units)
    .execute(pool)
    .await?;
    testkit::lose_activity(redis, id).await?;
    let far = || std::time::Instant::now() + Duration::from_secs(60);
    load::load_under_lock(redis, pool, config, id, far()).await?;
    while !drawing::rebuild(redis, pool, id, far()).await?.done {}
    close_window(admin, &redis.keys(id).meta).await?;
    let longest = std::sync::Mutex::new(Duration::ZERO);
    let timed = |took: Duration| {
        let mut l = longest.lock().expect("not poisoned");
        *l = (*l).max(took);
    };
    let measured = measure(client, admin, None, || async {
        let mut calls = 0;
        let mut winners = 0;
        loop {
            calls += 1;
            // Loaded from scratch: the drawer ends the wait for queued entries (none here).
            match draw::draw_with(redis, id, Duration::from_secs(60), true).await? {
                Drawn::Running { winners: w, .. } => winners += w,
                Drawn::Now { winners: w, .. } => {
                    winners += w;
                    break;
                }
                other => anyhow::bail!("the draw answered {other:?}"),
            }
        }
        let started = Instant::now();
        drawing::record(redis, pool, id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("the draw was not recorded"))?;
        timed(started.elapsed());
        let mut ordered = 0;
        loop {
            calls += 1;
            let started = Instant::now();
            // One chunk a call: its deadline is now.
            let w = drawing::write_orders(redis, pool, id, Some(std::time::Instant::now())).await?;
            timed(started.elapsed());
            ordered += w.ordered;
            if w.written {
                break;
            }
        }
        anyhow::ensure!(
            ordered as i64 == winners,
            "{ordered} orders for {winners} winners"
        );
        anyhow::Ok((calls, winners))
    })
    .await?;
    let mut r = row(n, "drawer", measured, entered.per_sec(), bytes_per_entrant);
    r.stock = units;
    r.longest_transaction_ms =
        Some(longest.into_inner().expect("not poisoned").as_secs_f64() * 1e3);
    Ok(r)
}

/// A draw where nothing fits, at `n` entrants: a sale of one unit whose entrants each ask
/// two (put into the pool in bulk as the consumer puts kept entries back, in calls of 1,000,
/// their tickets made there). Side by side on a copy of the pool whose meta does not count its
/// entries by units asked (what every draw did before it did): the same steps walking every
/// ticket.
#[allow(clippy::too_many_arguments)]
async fn nothing_fits(
    client: &redis::Client,
    admin: &mut MultiplexedConnection,
    config: &Config,
    redis: &Redis,
    pool: &PgPool,
    n: usize,
    bytes_per_entrant: f64,
) -> anyhow::Result<Vec<DrawRow>> {
    let now = chrono::Utc::now();
    let activity = activity::insert(
        pool,
        &testkit::new_activity()
            .title(format!("bench draw {n}, nothing fits"))
            .stock(1)
            .limit(2)
            .window(
                now - chrono::Duration::seconds(1),
                now + chrono::Duration::hours(1),
            )
            .draw(MAX_DRAW_WINDOW_MS)
            .rate(0)
            .build()
            .settings()?,
    )
    .await?;
    let far = || std::time::Instant::now() + Duration::from_secs(60);
    load::load_under_lock(redis, pool, config, activity.id, far()).await?;
    while !drawing::rebuild(redis, pool, activity.id, far())
        .await?
        .done
    {}
    let entered = Instant::now();
    for from in (0..n).step_by(1_000) {
        let entries: Vec<seckill_shared::domain::draw::Entry> = (from..n.min(from + 1_000))
            .map(|i| seckill_shared::domain::draw::Entry {
                request_id: Uuid::now_v7(),
                user_id: format!("pair-{i:07}"),
                quantity: 2,
            })
            .collect();
        draw::restore(
            redis,
            activity.id,
            None,
            draw::Restore::Entries,
            draw::RestoreCursor::None,
            &entries,
        )
        .await?
        .ok_or_else(|| anyhow::anyhow!("the sale is not loaded"))?;
    }
    let entries_per_sec = n as f64 / entered.elapsed().as_secs_f64().max(1e-9);
    let k = redis.keys(activity.id);
    let twin_id = activity.id + 1_000_000;
    let twin = redis.keys(twin_id);
    copy_sale(admin, &k, &twin).await?;
    let _: i64 = redis::cmd("HDEL")
        .arg(&twin.meta)
        .arg("fitCounts")
        .query_async(admin)
        .await?;
    close_window(admin, &k.meta).await?;
    close_window(admin, &twin.meta).await?;
    let sha = seckill_shared::store::scripts::DRAW.get_hash().to_string();
    let mut rows = Vec::new();
    for (id, what) in [
        (twin_id, "nothing fits, uncounted (walks)"),
        (activity.id, "nothing fits"),
    ] {
        let measured = measure(client, admin, Some(&sha), || async {
            let mut calls = 0;
            loop {
                calls += 1;
                match draw::draw(redis, id, Duration::ZERO).await? {
                    Drawn::Running { .. } => {}
                    Drawn::Now { winners, .. } => return anyhow::Ok((calls, winners)),
                    other => anyhow::bail!("the draw answered {other:?}"),
                }
            }
        })
        .await?;
        let mut r = row(n, what, measured, entries_per_sec, bytes_per_entrant);
        r.stock = 1;
        rows.push(r);
    }
    Ok(rows)
}

/// Copies a loaded draw sale's keys (meta, users, ledger, pool, winners, tickets) to `to`.
async fn copy_sale(
    admin: &mut MultiplexedConnection,
    from: &seckill_shared::store::keys::Keys,
    to: &seckill_shared::store::keys::Keys,
) -> anyhow::Result<()> {
    for (from, to) in [
        (&from.meta, &to.meta),
        (&from.users, &to.users),
        (&from.ledger, &to.ledger),
        (&from.pool, &to.pool),
        (&from.winners, &to.winners),
        (&from.tickets, &to.tickets),
    ] {
        let _: i64 = redis::cmd("COPY")
            .arg(from)
            .arg(to)
            .query_async(admin)
            .await?;
    }
    Ok(())
}

/// Closes a draw sale's window now: the meta's `drawEndMs` a moment past (its `terms` with it).
async fn close_window(admin: &mut MultiplexedConnection, meta: &str) -> anyhow::Result<()> {
    let past = chrono::Utc::now().timestamp_millis() - 1;
    testkit::set_term(admin, meta, "drawEndMs", past).await?;
    Ok(())
}

/// What one draw cost.
struct Measured {
    calls: usize,
    winners: i64,
    longest_us: u64,
    /// The longest call's script file, or its command.
    longest_call: String,
    draw_ms: f64,
    pings: u64,
    ping_max_ms: f64,
}

fn row(
    n: usize,
    draw: &'static str,
    m: Measured,
    entries_per_sec: f64,
    bytes_per_entrant: f64,
) -> DrawRow {
    let r = DrawRow {
        entrants: n,
        draw,
        stock: STOCK,
        calls: m.calls,
        winners: m.winners,
        longest_script_us: m.longest_us,
        longest_call: m.longest_call,
        longest_transaction_ms: None,
        draw_ms: m.draw_ms,
        pings: m.pings,
        ping_max_ms: m.ping_max_ms,
        entries_per_sec,
        bytes_per_entrant,
    };
    eprintln!(
        "  {n} entrants, {draw}: {} calls, {} winners, longest script {} µs ({}), draw {:.1} ms, \
         PING max {:.2} ms over {}",
        r.calls, r.winners, r.longest_script_us, r.longest_call, r.draw_ms, r.ping_max_ms, r.pings
    );
    r
}

/// Runs `draw` (answering its calls and winners) with the slow log emptied before and a PING
/// loop beside it; the longest slow-log entry of the script `sha` (`None`: of any command) is
/// its longest call.
async fn measure<F, Fut>(
    client: &redis::Client,
    admin: &mut MultiplexedConnection,
    sha: Option<&str>,
    draw: F,
) -> anyhow::Result<Measured>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(usize, i64)>>,
{
    let slowlog = SlowLog::open(admin).await?;
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(admin)
        .await?;
    let pinger = util::Pinger::start(client).await?;
    let started = Instant::now();
    let outcome = draw().await;
    let draw_ms = started.elapsed().as_secs_f64() * 1e3;
    let (pings, ping_max_ms) = pinger.stop().await?;
    let entries: redis::RedisResult<Vec<redis::Value>> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(admin)
        .await;
    slowlog.close(admin).await;
    let (calls, winners) = outcome?;
    let entries = entries?;
    let scripts: std::collections::HashMap<String, &str> = seckill_shared::store::scripts::SOURCES
        .iter()
        .map(|(file, source)| {
            let full = seckill_shared::store::scripts::with_prelude(source);
            (redis::Script::new(&full).get_hash().to_string(), *file)
        })
        .collect();
    let (longest_us, longest_call) = entries
        .iter()
        .filter_map(|entry| {
            let redis::Value::Array(fields) = entry else {
                return None;
            };
            let micros = match fields.get(2) {
                Some(redis::Value::Int(us)) => *us as u64,
                _ => return None,
            };
            let Some(redis::Value::Array(args)) = fields.get(3) else {
                return None;
            };
            let text = |v: &redis::Value| match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).to_lowercase(),
                _ => String::new(),
            };
            let ours = match sha {
                Some(sha) => args.len() > 1 && text(&args[0]) == "evalsha" && text(&args[1]) == sha,
                None => !args.is_empty() && text(&args[0]) != "ping",
            };
            let call = match text(&args[0]).as_str() {
                "evalsha" if args.len() > 1 => scripts
                    .get(&text(&args[1]))
                    .map_or_else(|| "evalsha".to_string(), |f| f.to_string()),
                other => other.to_string(),
            };
            ours.then_some((micros, call))
        })
        .max()
        .unwrap_or_default();
    Ok(Measured {
        calls,
        winners,
        longest_us,
        longest_call,
        draw_ms,
        pings,
        ping_max_ms,
    })
}

/// The slow log set to keep every command while a draw runs: threshold 0 and room for every
/// call; [`SlowLog::close`] puts the server's own settings back.
pub(crate) struct SlowLog {
    threshold: String,
    max_len: String,
}

impl SlowLog {
    async fn open(admin: &mut MultiplexedConnection) -> anyhow::Result<Self> {
        Self::open_at(admin, 0).await
    }

    /// The slow log emptied, keeping every call slower than `threshold_us`.
    pub(crate) async fn open_at(
        admin: &mut MultiplexedConnection,
        threshold_us: u64,
    ) -> anyhow::Result<Self> {
        let get = |name: &'static str| {
            let mut c = redis::cmd("CONFIG");
            c.arg("GET").arg(name);
            c
        };
        let (_, threshold): (String, String) =
            get("slowlog-log-slower-than").query_async(admin).await?;
        let (_, max_len): (String, String) = get("slowlog-max-len").query_async(admin).await?;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(threshold_us)
            .arg("slowlog-max-len")
            .arg(100_000)
            .query_async(admin)
            .await?;
        let _: () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(admin)
            .await?;
        Ok(Self { threshold, max_len })
    }

    /// Every call the log kept: its server µs and its command (a script's is `evalsha`).
    pub(crate) async fn slowest(
        &self,
        admin: &mut MultiplexedConnection,
    ) -> anyhow::Result<Vec<(u64, String)>> {
        let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(-1)
            .query_async(admin)
            .await?;
        Ok(entries
            .iter()
            .filter_map(|entry| {
                let redis::Value::Array(fields) = entry else {
                    return None;
                };
                let Some(redis::Value::Int(us)) = fields.get(2) else {
                    return None;
                };
                let Some(redis::Value::Array(args)) = fields.get(3) else {
                    return None;
                };
                let command = match args.first() {
                    Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).to_lowercase(),
                    _ => String::new(),
                };
                Some((*us as u64, command))
            })
            .collect())
    }

    pub(crate) async fn close(self, admin: &mut MultiplexedConnection) {
        let reset: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(&self.threshold)
            .arg("slowlog-max-len")
            .arg(&self.max_len)
            .query_async(admin)
            .await;
        if let Err(e) = reset {
            eprintln!("could not put the slow log's settings back: {e}");
        }
        let _: redis::RedisResult<()> = redis::cmd("SLOWLOG").arg("RESET").query_async(admin).await;
    }
}
