//! The entry function's cost: its router called in-process (as Lambda calls it, no TCP) against
//! bare calls of the same script, the sold-out flood with the in-process cache, the same router
//! over HTTP on the dev server's app, and accepted purchases (with the SQS send) against a bare
//! SendMessage loop on the same emulator.

mod accepted;
mod fixture;
mod http;

use fixture::{Bench, BODY};
pub use fixture::{Measure, PublicView, Sizes};

use crate::strategies::open_activity;
use crate::util::{self, Outcome, Run};
use axum::body::Body;
use axum::http::Request;
use seckill_entry::EntryState;
use seckill_shared::domain::purchase::Attempt;
use seckill_shared::infra::sqs::{OrderQueue, Queues};
use seckill_shared::store::conn::Redis;
use seckill_shared::store::keys::Home;
use seckill_shared::store::purchase::{self, Answer, Code};
use seckill_shared::store::scripts;
use seckill_shared::{Context, Refusal};
use serde::Serialize;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;
use uuid::Uuid;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryResults {
    /// Building one API Gateway-shaped request (what lambda_http does per event), µs,
    /// included in the in-process figures.
    pub request_build_us: f64,
    /// Router + handler, requests built beforehand.
    pub in_process: Measure,
    /// The same, each attempt also building its request.
    pub in_process_with_build: Measure,
    pub bare_script: Measure,
    pub entry_vs_limit: f64,
    pub entry_vs_limit_with_request_build: f64,
    pub sold_out_router: Measure,
    pub sold_out_router_with_build: Measure,
    pub sold_out_bare_script: Measure,
    pub sold_out_cache_vs_limit: f64,
    pub sold_out_cache_vs_limit_with_request_build: f64,
    pub http_entry: Option<Measure>,
    pub http_trivial: Option<Measure>,
    pub http_entry_vs_trivial: Option<f64>,
    pub accepted_router: Option<Measure>,
    pub sqs_bare_send: Option<Measure>,
    pub accepted_vs_sqs: Option<f64>,
    /// The public view over HTTP against cached sold-out purchases over HTTP.
    pub view: Option<PublicView>,
    /// `already_purchased` one request at a time: the router, the product's Redis call of the
    /// script (`store::purchase::run` on the entry's connection), and the bare script.
    pub sequential_entry: Measure,
    pub sequential_call: Measure,
    pub sequential_bare: Measure,
    /// µs the router and handler add to one bare script call (the sequential rows' difference).
    pub entry_overhead_us: f64,
    /// The part of it the product's Redis call adds to the bare script call; the rest is the
    /// router's and the handler's.
    pub call_overhead_us: f64,
    /// What each candidate on the refusal path costs (see `costs`).
    pub costs: Vec<crate::costs::Cost>,
}

pub async fn run(
    client: &redis::Client,
    database_url: &str,
    pool: &PgPool,
    users: Arc<Vec<String>>,
    sizes: &Sizes,
) -> anyhow::Result<EntryResults> {
    let mut config = testkit::config(database_url, testkit::RedisKind::Standalone);
    config.key_prefix = util::fresh_prefix();
    config.redis_timeout = Duration::from_secs(5);
    let sqs = seckill_shared::infra::sqs::sqs_client().await;
    let queue_url = testkit::fresh_queue(&sqs, 30, 5).await?;
    config.order_queue_url = queue_url.clone();
    let redis = Redis::connect(&config).await?;
    let queue = OrderQueue::new(sqs.clone(), queue_url.clone(), config.sqs_timeout);
    let state = EntryState::new(
        Context::new(config.clone(), pool.clone(), redis.clone()),
        Queues::one(queue),
    );
    let mut admin = client.get_multiplexed_async_connection().await?;
    let purchase_sha = scripts::PURCHASE
        .prepare_invoke()
        .load_async(&mut admin)
        .await?;
    let b = Bench {
        router: seckill_entry::router(state),
        redis,
        config,
        client: client.clone(),
        admin,
        users,
        purchase_sha,
    };
    let result = sections(&b, &sqs, &queue_url, sizes).await;
    let mut con = b.admin.clone();
    util::delete_prefix(&mut con, &b.config.key_prefix).await?;
    accepted::delete_queue(&sqs, &queue_url).await;
    result
}

async fn sections(
    b: &Bench,
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    sizes: &Sizes,
) -> anyhow::Result<EntryResults> {
    let request_build_us = request_build_cost();
    eprintln!("  building one API Gateway-shaped request: {request_build_us:.2} µs");
    let open_id = 1;
    let rejected = rejections(b, open_id, sizes).await?;
    let sold_out = sold_out(b, sizes).await?;
    eprintln!("  what cost what (one call at a time, one thread):");
    let (users, path) = (b.users.clone(), format!("/activities/{SOLD_OUT_ID}/orders"));
    let costs = crate::costs::measure(b.router.clone(), move |i| {
        let user = &users[i % users.len()];
        testkit::request("POST", &path, Some((user, "")), Some(BODY))
    })
    .await?;

    // 3. HTTP on the dev server's app (authorizer middleware + routers), with a trivial route.
    let (http_entry, http_trivial) = match http::http(b, open_id, rejected.users, sizes).await {
        Ok((e, t)) => (Some(e), Some(t)),
        Err(e) => {
            eprintln!("  ! HTTP section failed: {e:#}");
            (None, None)
        }
    };

    // 4. The public view over HTTP, against the sold-out flood over HTTP.
    let view = match http::public_view(b, sizes).await {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("  ! public view section failed: {e:#}");
            None
        }
    };

    // 5. Accepted purchases with their SQS send, against bare sends on the same emulator.
    let (accepted_router, sqs_bare_send) = match accepted::accepted(b, sqs, queue_url, sizes).await
    {
        Ok((a, s)) => (Some(a), Some(s)),
        Err(e) => {
            eprintln!("  ! accepted/SQS section failed: {e:#}");
            (None, None)
        }
    };

    Ok(EntryResults {
        request_build_us,
        entry_vs_limit: rejected.in_process.per_s / rejected.bare_script.per_s,
        entry_vs_limit_with_request_build: rejected.in_process_with_build.per_s
            / rejected.bare_script.per_s,
        sold_out_cache_vs_limit: sold_out.router.per_s / sold_out.bare_script.per_s,
        sold_out_cache_vs_limit_with_request_build: sold_out.router_with_build.per_s
            / sold_out.bare_script.per_s,
        in_process_with_build: rejected.in_process_with_build,
        sold_out_router_with_build: sold_out.router_with_build,
        http_entry_vs_trivial: match (&http_entry, &http_trivial) {
            (Some(e), Some(t)) => Some(e.per_s / t.per_s),
            _ => None,
        },
        accepted_vs_sqs: match (&accepted_router, &sqs_bare_send) {
            (Some(a), Some(s)) => Some(a.per_s / s.per_s),
            _ => None,
        },
        entry_overhead_us: (1.0 / rejected.sequential_entry.per_s
            - 1.0 / rejected.sequential_bare.per_s)
            * 1e6,
        call_overhead_us: (1.0 / rejected.sequential_call.per_s
            - 1.0 / rejected.sequential_bare.per_s)
            * 1e6,
        sequential_entry: rejected.sequential_entry,
        sequential_call: rejected.sequential_call,
        sequential_bare: rejected.sequential_bare,
        costs,
        in_process: rejected.in_process,
        bare_script: rejected.bare_script,
        sold_out_router: sold_out.router,
        sold_out_bare_script: sold_out.bare_script,
        http_entry,
        http_trivial,
        accepted_router,
        sqs_bare_send,
        view,
    })
}

/// Section 1's rows: refusals that reach Redis.
struct Rejections {
    /// Users already in the sale's users hash.
    users: usize,
    in_process: Measure,
    in_process_with_build: Measure,
    bare_script: Measure,
    sequential_entry: Measure,
    sequential_call: Measure,
    sequential_bare: Measure,
}

/// 1. Rejections that reach Redis: already_purchased (not short-circuited by the sold-out
///    cache: the activity has plenty of stock). 10k users, each already holding a reservation
///    made by the purchase script.
async fn rejections(b: &Bench, open_id: i64, sizes: &Sizes) -> anyhow::Result<Rejections> {
    let (c, n) = (sizes.concurrency, sizes.rejections);
    let users = b.users.len().min(10_000);
    let activity = open_activity(open_id, 1_000_000);
    testkit::load_without_db(&b.redis, &activity, Duration::from_secs(3600)).await?;
    buy_for(b, open_id, users).await?;
    // Warm-up (discarded): the router's connection, the script cache, runtime threads.
    let warm = n.min(10_000);
    let code = Refusal::AlreadyPurchased.code();
    let purchased = Code::AlreadyPurchased as i64;
    router_loop(b, "warm-up: router", open_id, users, warm, c, code, None).await?;
    bare_loop(
        b,
        "warm-up: bare EVALSHA",
        open_id,
        users,
        warm,
        c,
        purchased,
    )
    .await?;
    let what = "entry in-process (already_purchased)";
    let in_process = router_loop(b, what, open_id, users, n, c, code, ROUND_ON_REDIS).await?;
    let what = "entry in-process + request build (already_purchased)";
    let in_process_with_build = router_loop(b, what, open_id, users, n, c, code, None).await?;
    let what = "bare EVALSHA (already_purchased)";
    let bare_script = bare_loop(b, what, open_id, users, n, c, purchased).await?;
    let one = n.min(5_000);
    let what = "entry in-process, one at a time (already_purchased)";
    let sequential_entry =
        router_loop(b, what, open_id, users, one, 1, code, ROUND_ON_REDIS).await?;
    let what = "store::purchase::run, one at a time (already_purchased)";
    let sequential_call = call_loop(b, what, open_id, users, one, 1).await?;
    let what = "bare EVALSHA, one at a time (already_purchased)";
    let sequential_bare = bare_loop(b, what, open_id, users, one, 1, purchased).await?;
    Ok(Rejections {
        users,
        in_process,
        in_process_with_build,
        bare_script,
        sequential_entry,
        sequential_call,
        sequential_bare,
    })
}

/// Section 2's rows: the sold-out flood.
struct SoldOut {
    router: Measure,
    router_with_build: Measure,
    bare_script: Measure,
}

/// The activity the sold-out flood runs on (loaded with no stock).
const SOLD_OUT_ID: i64 = 2;

/// 2. The sold-out flood: an activity with no stock left.
async fn sold_out(b: &Bench, sizes: &Sizes) -> anyhow::Result<SoldOut> {
    let (c, n, users) = (sizes.concurrency, sizes.sold_out, b.users.len());
    let id = SOLD_OUT_ID;
    let activity = open_activity(id, 0);
    testkit::load_without_db(&b.redis, &activity, Duration::from_secs(3600)).await?;
    let what = "entry in-process, sold out (cache warm)";
    let code = Refusal::SoldOut { stock_left: 0 }.code();
    let router = router_loop(b, what, id, users, n, c, code, ROUND_IN_MEMORY).await?;
    let what = "entry in-process + request build, sold out";
    let router_with_build = router_loop(b, what, id, users, n, c, code, None).await?;
    let what = "bare EVALSHA (sold_out)";
    let sold_out = Code::SoldOut as i64;
    let bare_script = bare_loop(b, what, id, users, n, c, sold_out).await?;
    Ok(SoldOut {
        router,
        router_with_build,
        bare_script,
    })
}

/// µs to build one request with its API Gateway request context (single thread).
fn request_build_cost() -> f64 {
    let n = 20_000;
    let t = Instant::now();
    for i in 0..n {
        let user = format!("user-{i:07}");
        let req = testkit::request(
            "POST",
            "/activities/1/orders",
            Some((&user, "")),
            Some(BODY),
        );
        std::hint::black_box(req);
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The first `n` users buy one unit each through the product's own script, so each of them
/// holds a reservation: their next purchase is `already_purchased`.
async fn buy_for(b: &Bench, activity_id: i64, n: usize) -> anyhow::Result<()> {
    let (redis, users) = (b.redis.clone(), b.users.clone());
    let run = util::run_tasks(16, n, move |i| {
        let (redis, users) = (redis.clone(), users.clone());
        async move {
            let far = purchase::far_deadline();
            match testkit::purchase(&redis, activity_id, &users[i], 1, Uuid::now_v7(), far).await {
                Ok(Ok(_)) => Outcome::Sold,
                other => Outcome::Error(format!("{other:?}")),
            }
        }
    })
    .await;
    anyhow::ensure!(
        run.counts.sold == n as u64,
        "only {} of {n} users could buy: {:?}",
        run.counts.sold,
        run.counts.first_error
    );
    Ok(())
}

/// Requests built beforehand, per round, for loops whose every request waits on Redis: a
/// round's tail (the last tasks finishing while the rest wait for the next round) drains the
/// pipeline, so rounds are long.
const ROUND_ON_REDIS: Option<usize> = Some(25_000);
/// For loops answered in memory (a cached sold-out refusal takes about a microsecond): short
/// rounds, so the built requests are still in the CPU's cache when the router takes them
/// (25k requests with their API Gateway context are tens of MB, and reading them back from
/// memory cost more than the router itself).
const ROUND_IN_MEMORY: Option<usize> = Some(2_048);

/// Calls the router in-process. With `prebuilt` (a round size), the requests (with their API
/// Gateway context) are built before the timed loop, a round at a time, so only the router and
/// handler are timed; without it each attempt also builds its request, as lambda_http does per
/// event.
#[allow(clippy::too_many_arguments)]
async fn router_loop(
    b: &Bench,
    what: &str,
    activity_id: i64,
    user_count: usize,
    attempts: usize,
    concurrency: usize,
    expect: &'static str,
    prebuilt: Option<usize>,
) -> anyhow::Result<Measure> {
    let path = Arc::new(format!("/activities/{activity_id}/orders"));
    let mut admin = b.admin.clone();
    let before = util::commandstats(&mut admin).await?;
    let round = prebuilt.unwrap_or(attempts);
    let prebuilt = prebuilt.is_some();
    let mut total: Option<Run> = None;
    let mut done = 0;
    while done < attempts {
        let n = round.min(attempts - done);
        let offset = done;
        let requests: Arc<Vec<std::sync::Mutex<Option<Request<Body>>>>> = Arc::new(if prebuilt {
            (0..n)
                .map(|i| {
                    let user = &b.users[(offset + i) % user_count];
                    std::sync::Mutex::new(Some(testkit::request(
                        "POST",
                        &path,
                        Some((user, "")),
                        Some(BODY),
                    )))
                })
                .collect()
        } else {
            Vec::new()
        });
        let router = b.router.clone();
        let users = b.users.clone();
        let path = path.clone();
        let run = util::run_tasks(concurrency, n, move |i| {
            let router = router.clone();
            let req = if prebuilt {
                requests[i]
                    .lock()
                    .expect("unpoisoned")
                    .take()
                    .expect("each request once")
            } else {
                let user = &users[(offset + i) % user_count];
                testkit::request("POST", &path, Some((user, "")), Some(BODY))
            };
            async move {
                let resp = match router.oneshot(req).await {
                    Ok(r) => r,
                    Err(e) => return Outcome::Error(e.to_string()),
                };
                let status = resp.status();
                let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                    .await
                    .unwrap_or_default();
                if status.as_u16() == 409 && contains(&body, expect.as_bytes()) {
                    Outcome::Refused
                } else {
                    Outcome::Error(format!("{status} {}", String::from_utf8_lossy(&body)))
                }
            }
        })
        .await;
        total = Some(match total {
            None => run,
            Some(mut t) => {
                t.attempts += run.attempts;
                t.elapsed += run.elapsed;
                t.hist.add(run.hist).expect("same bounds");
                t.counts.sold += run.counts.sold;
                t.counts.refused += run.counts.refused;
                t.counts.errors += run.counts.errors;
                if t.counts.first_error.is_none() {
                    t.counts.first_error = run.counts.first_error;
                }
                t
            }
        });
        done += n;
    }
    let after = util::commandstats(&mut admin).await?;
    let run = total.expect("at least one round");
    Ok(Measure::from_run(
        what,
        &run,
        concurrency,
        Some(util::commands_between(&before, &after)),
    ))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The purchase script as the entry calls it (`store::purchase::run`: the arguments built,
/// the call on the entry's connection under its timeout, the answer read), expecting
/// `already_purchased`.
async fn call_loop(
    b: &Bench,
    what: &str,
    activity_id: i64,
    user_count: usize,
    attempts: usize,
    concurrency: usize,
) -> anyhow::Result<Measure> {
    let (redis, users) = (b.redis.clone(), b.users.clone());
    counted_run(b, what, attempts, concurrency, move |i| {
        let (redis, users) = (redis.clone(), users.clone());
        async move {
            let attempt = Attempt {
                request_id: Uuid::now_v7(),
                activity_id,
                user_id: users[i % user_count].clone(),
                quantity: 1,
                buckets: 1,
            };
            let far = purchase::far_deadline();
            match purchase::run(&redis, attempt.home(), &attempt, far, &[]).await {
                Ok((Answer::Refused(Refusal::AlreadyPurchased), _)) => Outcome::Refused,
                Ok((answer, _)) => Outcome::Error(format!("script answered {answer:?}")),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await
}

/// Raw EVALSHA of the purchase script on one connection manager, arguments prepared
/// beforehand, expecting `code`.
async fn bare_loop(
    b: &Bench,
    what: &str,
    activity_id: i64,
    user_count: usize,
    attempts: usize,
    concurrency: usize,
    code: i64,
) -> anyhow::Result<Measure> {
    let cm = util::manager(&b.client).await?;
    let k = Arc::new(b.redis.keys(activity_id));
    let users = b.users.clone();
    let sha = Arc::new(b.purchase_sha.clone());
    let request_ids: Arc<Vec<String>> =
        Arc::new((0..attempts).map(|_| Uuid::now_v7().to_string()).collect());
    // The bucket count and the sale's terms, as the entry passes them once it has read them.
    let terms = purchase::read_terms(&b.redis, activity_id.into()).await?;
    let mut carried = vec!["1".to_string()];
    carried.extend(purchase::carried(terms.as_ref()).map(String::from));
    let carried = Arc::new(carried);
    counted_run(b, what, attempts, concurrency, move |i| {
        let mut cm = cm.clone();
        let k = k.clone();
        let users = users.clone();
        let sha = sha.clone();
        let request_ids = request_ids.clone();
        let carried = carried.clone();
        async move {
            // purchase.lua answers {code, value, nowMs, epoch, credited}, or a bare sold-out
            // code: the code is all this row reads.
            let r: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
                .arg(sha.as_str())
                .arg(3)
                .arg(&k.meta)
                .arg(&k.users)
                .arg(&k.ledger)
                .arg(&users[i % user_count])
                .arg(1)
                .arg(&request_ids[i])
                .arg(purchase::far_deadline())
                .arg(carried.as_slice())
                .query_async(&mut cm)
                .await;
            match r.and_then(purchase::reply) {
                Ok(answer) if answer.code == code => Outcome::Refused,
                Ok(answer) => {
                    Outcome::Error(format!("script answered {answer:?}, expected {code}"))
                }
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await
}

/// `attempts` calls of `f`, `concurrency` at once, with the commands the Redis server ran
/// meanwhile (its `INFO commandstats` before and after).
async fn counted_run<F, Fut>(
    b: &Bench,
    what: &str,
    attempts: usize,
    concurrency: usize,
    f: F,
) -> anyhow::Result<Measure>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Outcome> + Send + 'static,
{
    let mut admin = b.admin.clone();
    let before = util::commandstats(&mut admin).await?;
    let run = util::run_tasks(concurrency, attempts, f).await;
    let after = util::commandstats(&mut admin).await?;
    Ok(Measure::from_run(
        what,
        &run,
        concurrency,
        Some(util::commands_between(&before, &after)),
    ))
}
