//! Purchase scripts side by side, each by EVALSHA on the same Redis in the same run, under the
//! strategies' two workloads: what one call costs the server (`INFO commandstats`: the
//! `evalsha` usec over its calls during the row) and how many calls a second one connection
//! carries.
//!
//! - the combined check-and-set script (GET stock, SISMEMBER user, DECR, SADD),
//!   `bench/scripts/combined_check_and_set.lua` (rows and ratios name it `combined`).
//! - atomic deduction on a goods hash (HGET + HINCRBY), `bench/scripts/hget_hincrby.lua`
//!   (rows name it `hget-hincrby`).
//! - `hmdp`: the widely copied 黑马点评 voucher script (GET, SISMEMBER, INCRBY -1, SADD, XADD
//!   to the order stream), `bench/scripts/hmdp_seckill.lua`.
//! - `ours`: `lua/purchase.lua` through `testkit::purchase`, as the strategies' `lua` row runs
//!   it, on a sale loaded by the product's own preheat (`testkit::load_without_db`): after its
//!   first call the handle carries the sale's terms, as the entry's does.
//! - `ours-fresh`: the same script with no terms carried, as a container's first purchase of a
//!   sale (and any caller whose copy is stale) calls it: the terms read from the meta.
//! - `floor`: `return 0`, what any EVALSHA costs this server before the script does anything.
//! - Ours cut after each step, on ours' keys and arguments, each answering a bare 0 and writing
//!   nothing: under the failure-heavy workload `ours-head` (the meta's one HMGET alone, which
//!   the sold-out answer then reads); under the success-heavy one `ours-meta` (the HMGET, the
//!   functions made, the loaded and bucket-count checks), `ours-clock` (+ the rate and credits
//!   a sale without them skips, TIME), `ours-checks` (+ the deadline, the window, the limit),
//!   `ours-user` (+ the stock check and the user's HGET). Each is the script's own text as Redis
//!   runs it, cut after a line of its main. With `floor` below them and ours' whole script above (the reservation's
//!   writes and the answer), the rows are each path's profile on the server: what each µs buys.
//! - `ours-commands` (success-heavy only): ours' success path as its six Redis commands alone,
//!   writing what ours writes, with no function made and nothing checked,
//!   `bench/scripts/ours_commands.lua`: the floor under any script that keeps what ours keeps.
//!
//! Each row also splits its server time: the µs spent inside the Redis commands the script
//! called (their own `cmdstat_*` usec over the row) and the rest, which is the script call
//! itself and its Lua (argument tables, number parsing, the reply).
//!
//! The peers' keys are written here directly (they are the peers' own layouts); ours are
//! only ever written by the product's scripts.

use crate::strategies::{open_activity, Workload};
use crate::util::{self, CommandTime, Outcome};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::Script;
use seckill_shared::store::conn::Redis;
use seckill_shared::store::conn::RedisConn;
use seckill_shared::store::{purchase, scripts};

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use uuid::Uuid;

static COMBINED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/combined_check_and_set.lua")));
static HGET_HINCRBY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/hget_hincrby.lua")));
static HMDP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/hmdp_seckill.lua")));
static FLOOR: LazyLock<Script> = LazyLock::new(|| Script::new("return 0"));
static OURS_COMMANDS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/ours_commands.lua")));

/// `lua/purchase.lua` as Redis runs it (behind the prelude's functions it calls).
static OURS_TEXT: LazyLock<String> =
    LazyLock::new(|| scripts::with_prelude(include_str!("../../lua/purchase.lua")));
/// The line of the script's main each step ends with. The meta's one HMGET (and whether the
/// caller's terms are the meta's). A success's steps: the functions made, the terms taken,
/// whether the sale is loaded and the caller's bucket count; the rate (none here), the credits
/// (none), the server clock; every check up to the stock; the stock check and the user's
/// field.
const OURS_HEAD: &str = "local carried = meta[1] == ARGV[6] and meta[2] == ARGV[7]";
const OURS_META: &str =
    "if buckets ~= tonumber(ARGV[5]) then return answer(LAYOUT, buckets, 0, 0) end";
const OURS_CLOCK: &str = "local now = now_ms()";
const OURS_CHECKS: &str = "local stock = tonumber(meta[3] or '0')";
const OURS_USER: &str = "code, value = refuse_or_replay(stock, qty, buckets)";

/// Ours cut after the main's line `last`, answering 0: what the whole script makes and runs
/// up to that step.
fn ours_cut(last: &str) -> String {
    let line = format!("\n{last}\n");
    let at = OURS_TEXT
        .find(&line)
        .unwrap_or_else(|| panic!("not a line of lua/purchase.lua: {last}"));
    format!("{}return 0\n", &OURS_TEXT[..at + line.len()])
}

static OURS_CUTS: LazyLock<BTreeMap<&'static str, Script>> = LazyLock::new(|| {
    Peer::STEPS
        .iter()
        .chain(&Peer::HEAD)
        .map(|p| (p.name(), Script::new(&ours_cut(p.last_line()))))
        .collect()
});

/// One purchase script of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Combined,
    HgetHincrby,
    Hmdp,
    Ours,
    Floor,
    OursHead,
    OursMeta,
    OursClock,
    OursChecks,
    OursUser,
    OursCommands,
    OursFresh,
}

impl Peer {
    pub const ALL: [Peer; 5] = [
        Peer::Combined,
        Peer::HgetHincrby,
        Peer::Hmdp,
        Peer::Ours,
        Peer::Floor,
    ];
    /// The sold-out answer cut after its read (failure-heavy only).
    pub const HEAD: [Peer; 1] = [Peer::OursHead];
    /// A success cut after each step (success-heavy only).
    pub const STEPS: [Peer; 4] = [
        Peer::OursMeta,
        Peer::OursClock,
        Peer::OursChecks,
        Peer::OursUser,
    ];

    /// Ours' success path as its commands alone (success-heavy only).
    pub const COMMANDS: [Peer; 1] = [Peer::OursCommands];

    /// Ours with no terms carried (both workloads).
    pub const FRESH: [Peer; 1] = [Peer::OursFresh];

    /// The line of lua/purchase.lua's main a cut of ours ends with.
    fn last_line(self) -> &'static str {
        match self {
            Peer::OursHead => OURS_HEAD,
            Peer::OursMeta => OURS_META,
            Peer::OursClock => OURS_CLOCK,
            Peer::OursChecks => OURS_CHECKS,
            Peer::OursUser => OURS_USER,
            _ => unreachable!("{self:?} is no cut of ours"),
        }
    }

    fn is_cut(self) -> bool {
        Peer::HEAD.contains(&self) || Peer::STEPS.contains(&self)
    }

    pub fn name(self) -> &'static str {
        match self {
            Peer::Combined => "combined",
            Peer::HgetHincrby => "hget-hincrby",
            Peer::Hmdp => "hmdp",
            Peer::Ours => "ours",
            Peer::Floor => "floor",
            Peer::OursHead => "ours-head",
            Peer::OursMeta => "ours-meta",
            Peer::OursClock => "ours-clock",
            Peer::OursChecks => "ours-checks",
            Peer::OursUser => "ours-user",
            Peer::OursCommands => "ours-commands",
            Peer::OursFresh => "ours-fresh",
        }
    }

    /// What the script does, for the table.
    pub fn what(self) -> &'static str {
        match self {
            Peer::Combined => "combined: GET, SISMEMBER, DECR, SADD",
            Peer::HgetHincrby => "hget-hincrby: HGET, HINCRBY (no user check)",
            Peer::Hmdp => "hmdp: GET, SISMEMBER, INCRBY, SADD, XADD",
            Peer::Ours => "ours: lua/purchase.lua via testkit::purchase",
            Peer::Floor => "floor: return 0 (any EVALSHA)",
            Peer::OursHead => "ours' sold-out answer, its read alone: the meta's HMGET",
            Peer::OursMeta => "ours' success, step 1: the meta's HMGET, the functions made",
            Peer::OursClock => "ours' success, steps 1-2: + TIME",
            Peer::OursChecks => "ours' success, steps 1-3: + the window and limit checks",
            Peer::OursUser => "ours' success, steps 1-4: + the stock check, the user's HGET",
            Peer::OursCommands => {
                "ours' success as its six commands alone (HMGET, TIME, HGET, 3 HSET; no function, no check)"
            }
            Peer::OursFresh => "ours with no terms carried: the window, limit, draw end and rate read from the meta",
        }
    }
}

/// One row: one script under one workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScriptRow {
    pub script: &'static str,
    pub what: &'static str,
    pub workload: &'static str,
    pub attempts: usize,
    pub stock: i64,
    pub concurrency: usize,
    pub attempts_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Server µs per EVALSHA (`cmdstat_evalsha` usec ÷ calls over the row).
    pub server_us_per_call: Option<f64>,
    /// The part of it spent inside the Redis commands the script called (their `cmdstat_*`
    /// usec over the row ÷ the script's calls); the rest is the call itself and its Lua.
    pub commands_us_per_call: Option<f64>,
    /// Commands the server executed per call, the script's own calls included.
    pub redis_commands_per_call: f64,
    pub sold: u64,
    pub errors: u64,
}

/// What one row's attempts need.
struct Ctx {
    peer: Peer,
    cm: ConnectionManager,
    redis: Redis,
    sha: String,
    stock: String,
    users: String,
    goods: String,
    stream: String,
    users_list: Arc<Vec<String>>,
    order_ids: Vec<String>,
    /// Ours' arguments 6 to 12: the sale's terms carried (seven empty ones for `ours-fresh`).
    carried: Vec<String>,
}

/// Every script under both workloads (`attempts` each), after a discarded warm-up of each.
pub async fn run(
    client: &redis::Client,
    admin: &MultiplexedConnection,
    users: Arc<Vec<String>>,
    attempts: usize,
    concurrency: usize,
) -> anyhow::Result<Vec<ScriptRow>> {
    let every = Peer::ALL.iter().chain(&Peer::HEAD).chain(&Peer::STEPS);
    for &peer in every.chain(&Peer::COMMANDS).chain(&Peer::FRESH) {
        let warm = Workload::success_heavy(attempts.min(2_000));
        measure(client, admin, &users, peer, warm, concurrency).await?;
    }
    let mut rows = Vec::new();
    for wl in [
        Workload::success_heavy(attempts),
        Workload::failure_heavy(attempts),
    ] {
        let steps: Vec<Peer> = if wl.name == "failure-heavy" {
            [&Peer::HEAD[..], &Peer::FRESH[..]].concat()
        } else {
            [&Peer::STEPS[..], &Peer::COMMANDS[..], &Peer::FRESH[..]].concat()
        };
        for &peer in Peer::ALL.iter().chain(&steps) {
            eprintln!(
                "- {} / {}: {} attempts, stock {}",
                peer.name(),
                wl.name,
                wl.attempts,
                wl.stock
            );
            let row = measure(client, admin, &users, peer, wl, concurrency).await?;
            eprintln!(
                "  {:>9.0}/s  server {:.2} µs/call  cmds/call {:.2}  sold {}",
                row.attempts_per_s,
                row.server_us_per_call.unwrap_or(f64::NAN),
                row.redis_commands_per_call,
                row.sold
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

async fn measure(
    client: &redis::Client,
    admin: &MultiplexedConnection,
    users: &Arc<Vec<String>>,
    peer: Peer,
    wl: Workload,
    concurrency: usize,
) -> anyhow::Result<ScriptRow> {
    let c = Arc::new(setup(client, admin, users, peer, wl).await?);
    let mut con = admin.clone();
    let before = util::command_times(&mut con).await?;
    let ctx = c.clone();
    let run = util::run_tasks(concurrency, wl.attempts, move |i| {
        let ctx = ctx.clone();
        async move {
            attempt(&ctx, i)
                .await
                .unwrap_or_else(|e| Outcome::Error(format!("{e:#}")))
        }
    })
    .await;
    let after = util::command_times(&mut con).await?;
    run.warn_errors(peer.name());
    // The two INFO calls between the snapshots are not the script's.
    let commands = util::commands_between(&util::calls(&before), &util::calls(&after));
    let evalsha =
        |times: &BTreeMap<String, CommandTime>| times.get("evalsha").copied().unwrap_or_default();
    let server_us_per_call = evalsha(&after).us_per_call_since(evalsha(&before));
    let script_calls = evalsha(&after).calls.saturating_sub(evalsha(&before).calls);
    let commands_us_per_call = (script_calls > 0)
        .then(|| util::usec_outside(&before, &after, "evalsha") as f64 / script_calls as f64);
    util::delete_prefix(&mut con, &c.redis.prefix).await?;
    Ok(ScriptRow {
        script: peer.name(),
        what: peer.what(),
        workload: wl.name,
        attempts: wl.attempts,
        stock: wl.stock,
        concurrency,
        attempts_per_s: run.per_sec(),
        p50_ms: run.p50_ms(),
        p99_ms: run.p99_ms(),
        server_us_per_call,
        commands_us_per_call,
        redis_commands_per_call: commands as f64 / wl.attempts as f64,
        sold: run.counts.sold,
        errors: run.counts.errors,
    })
}

async fn setup(
    client: &redis::Client,
    admin: &MultiplexedConnection,
    users: &Arc<Vec<String>>,
    peer: Peer,
    wl: Workload,
) -> anyhow::Result<Ctx> {
    let prefix = util::fresh_prefix();
    let cm = util::manager(client).await?;
    let redis = Redis::new(
        RedisConn::Standalone(cm.clone()),
        &prefix,
        Duration::from_secs(5),
    );
    let activity_id = 1;
    let tag = format!("{prefix}:{{{activity_id}}}");
    let mut con = admin.clone();
    let script = match peer {
        Peer::Combined => Some(&*COMBINED),
        Peer::HgetHincrby => Some(&*HGET_HINCRBY),
        Peer::Hmdp => Some(&*HMDP),
        Peer::Floor => Some(&*FLOOR),
        Peer::OursCommands => Some(&*OURS_COMMANDS),
        Peer::OursFresh => Some(&*scripts::PURCHASE),
        Peer::Ours => None,
        cut => Some(&OURS_CUTS[cut.name()]),
    };
    let sha = match script {
        Some(s) => s.prepare_invoke().load_async(&mut con).await?,
        None => String::new(),
    };
    let mut c = Ctx {
        peer,
        cm,
        sha,
        stock: format!("{tag}:stock"),
        users: format!("{tag}:users"),
        goods: format!("{tag}:goods"),
        stream: format!("{tag}:stream.orders"),
        users_list: users.clone(),
        order_ids: if peer == Peer::Hmdp {
            (0..wl.attempts)
                .map(|i| (i as u64 + 1).to_string())
                .collect()
        } else {
            Vec::new()
        },
        redis,
        carried: Vec::new(),
    };
    match peer {
        Peer::Combined | Peer::Hmdp => {
            let _: () = redis::cmd("SET")
                .arg(&c.stock)
                .arg(wl.stock)
                .query_async(&mut con)
                .await?;
        }
        Peer::HgetHincrby => {
            let _: i64 = redis::cmd("HSET")
                .arg(&c.goods)
                .arg("stock")
                .arg(wl.stock)
                .query_async(&mut con)
                .await?;
        }
        Peer::Floor => {}
        _ => {
            testkit::load_without_db(
                &c.redis,
                &open_activity(activity_id, wl.stock),
                Duration::from_secs(3600),
            )
            .await?;
            let terms = match peer {
                Peer::OursFresh => None,
                _ => purchase::read_terms(&c.redis, activity_id.into()).await?,
            };
            c.carried = purchase::carried(terms.as_ref()).map(String::from).to_vec();
        }
    }
    Ok(c)
}

async fn attempt(c: &Ctx, i: usize) -> anyhow::Result<Outcome> {
    let user = &c.users_list[i % c.users_list.len()];
    let mut cm = c.cm.clone();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&c.sha);
    // Each script's answer for "bought"; any other answer it documents is a refusal.
    let (code, bought): (i64, i64) = match c.peer {
        Peer::Ours => {
            let d = testkit::purchase(
                &c.redis,
                1,
                user,
                1,
                Uuid::now_v7(),
                purchase::far_deadline(),
            )
            .await?;
            return Ok(if d.is_ok() {
                Outcome::Sold
            } else {
                Outcome::Refused
            });
        }
        Peer::Combined => {
            cmd.arg(2).arg(&c.stock).arg(&c.users).arg(user);
            (cmd.query_async(&mut cm).await?, 1)
        }
        Peer::HgetHincrby => {
            cmd.arg(1).arg(&c.goods).arg("stock").arg(1);
            (cmd.query_async(&mut cm).await?, 1)
        }
        Peer::Hmdp => {
            cmd.arg(3)
                .arg(&c.stock)
                .arg(&c.users)
                .arg(&c.stream)
                .arg(1)
                .arg(user)
                .arg(&c.order_ids[i]);
            (cmd.query_async(&mut cm).await?, 0)
        }
        Peer::Floor => {
            cmd.arg(0);
            (cmd.query_async(&mut cm).await?, 1)
        }
        Peer::OursCommands => {
            let k = c.redis.keys(1);
            cmd.arg(3).arg(&k.meta).arg(&k.users).arg(&k.ledger);
            cmd.arg(user).arg(1).arg(Uuid::now_v7().to_string());
            // It reserves every time, answering 0.
            (cmd.query_async(&mut cm).await?, 0)
        }
        Peer::OursFresh => {
            let k = c.redis.keys(1);
            cmd.arg(6).arg(&k.meta).arg(&k.users).arg(&k.ledger);
            cmd.arg(&k.pool).arg(k.rate(user)).arg(&k.tickets);
            cmd.arg(user).arg(1).arg(Uuid::now_v7().to_string());
            cmd.arg(purchase::far_deadline()).arg(1).arg(&c.carried);
            let answer: redis::Value = cmd.query_async(&mut cm).await?;
            let reply = purchase::reply(answer)?;
            // With no copy carried, every answer carries the meta's terms.
            if reply.terms.is_none() {
                return Ok(Outcome::Error("ours-fresh was answered no terms".into()));
            }
            (reply.code, 0)
        }
        cut => {
            debug_assert!(cut.is_cut());
            let k = c.redis.keys(1);
            cmd.arg(3).arg(&k.meta).arg(&k.users).arg(&k.ledger);
            cmd.arg(user).arg(1).arg(Uuid::now_v7().to_string());
            // The bucket count `testkit::purchase` passes for a sale with one bucket, and the
            // sale's terms it carries once it has read them.
            cmd.arg(purchase::far_deadline()).arg(1).arg(&c.carried);
            // Each cut answers a bare 0.
            let code: i64 = cmd.query_async(&mut cm).await?;
            return Ok(if code == 0 {
                Outcome::Refused
            } else {
                Outcome::Error(format!("{} answered {code}", c.peer.name()))
            });
        }
    };
    Ok(match code {
        _ if code == bought => Outcome::Sold,
        -1 => Outcome::Error(format!("{} found no stock key", c.peer.name())),
        _ => Outcome::Refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuts_cut_the_purchase_scripts_main_in_its_order() {
        let cuts: Vec<String> = Peer::HEAD
            .iter()
            .chain(&Peer::STEPS)
            .map(|p| ours_cut(p.last_line()))
            .collect();
        for pair in cuts.windows(2) {
            let shorter = pair[0].trim_end_matches("return 0\n");
            assert!(pair[1].starts_with(shorter), "the steps are out of order");
            assert!(pair[1].len() > pair[0].len());
        }
        for cut in &cuts {
            assert!(OURS_TEXT.starts_with(cut.trim_end_matches("return 0\n")));
        }
        // The sold-out answer's read comes before any function is made.
        assert!(!cuts[0].contains("local function "));
    }
}
