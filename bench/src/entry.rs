//! The entry function's cost: its router called in-process (as Lambda calls it, no TCP) against
//! bare calls of the same script, the sold-out flood with the in-process cache, the same router
//! over HTTP on the dev server's app, and accepted purchases (with the SQS send) against a bare
//! SendMessage loop on the same emulator.

use crate::strategies::open_activity;
use crate::util::{self, Outcome, Run};
use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use seckill_entry::EntryState;
use seckill_shared::auth::{mint, JwtVerifier};
use seckill_shared::cache::Redis;
use seckill_shared::queue::{OrderMessage, OrderQueue};
use seckill_shared::Deps;
use seckill_shared::{sale, scripts, testing, Config, Refusal};
use serde::Serialize;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;
use uuid::Uuid;

const BODY: &str = r#"{"quantity":1}"#;

/// One measured loop.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measure {
    pub what: String,
    pub attempts: usize,
    pub concurrency: usize,
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Redis commands the server executed per attempt (INFO commandstats delta), where
    /// measured.
    pub redis_commands_per_attempt: Option<f64>,
    pub errors: u64,
}

impl Measure {
    fn from_run(what: &str, run: &Run, concurrency: usize, commands: Option<u64>) -> Self {
        run.warn_errors(what);
        let m = Self {
            what: what.to_string(),
            attempts: run.attempts,
            concurrency,
            per_s: run.per_sec(),
            p50_ms: run.p50_ms(),
            p99_ms: run.p99_ms(),
            redis_commands_per_attempt: commands.map(|c| c as f64 / run.attempts as f64),
            errors: run.counts.errors,
        };
        eprintln!(
            "  {:<44} {:>9.0}/s  p50 {:.3} ms  p99 {:.3} ms{}",
            m.what,
            m.per_s,
            m.p50_ms,
            m.p99_ms,
            m.redis_commands_per_attempt
                .map(|c| format!("  cmds/attempt {c:.2}"))
                .unwrap_or_default()
        );
        m
    }
}

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
}

pub struct Sizes {
    pub concurrency: usize,
    pub rejections: usize,
    pub sold_out: usize,
    pub http: usize,
    pub sqs_sends: usize,
    pub sqs_concurrency: usize,
}

/// The entry state and what the section needs around it.
struct Bench {
    config: Config,
    redis: Redis,
    router: Router,
    client: redis::Client,
    admin: redis::aio::MultiplexedConnection,
    users: Arc<Vec<String>>,
    purchase_sha: String,
}

pub async fn run(
    client: &redis::Client,
    database_url: &str,
    pool: &PgPool,
    users: Arc<Vec<String>>,
    sizes: &Sizes,
) -> anyhow::Result<EntryResults> {
    let mut config = testing::config(database_url, testing::RedisKind::Standalone);
    config.key_prefix = util::fresh_prefix();
    config.redis_timeout = Duration::from_secs(5);
    let sqs = seckill_shared::queue::sqs_client().await;
    let queue_url = testing::fresh_queue(&sqs, 30, 5).await?;
    config.order_queue_url = queue_url.clone();
    let redis = Redis::connect(&config).await?;
    let queue = OrderQueue::new(sqs.clone(), queue_url.clone(), config.sqs_timeout);
    let state = EntryState::new(
        Deps::new(config.clone(), pool.clone(), redis.clone()),
        queue,
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
    delete_queue(&sqs, &queue_url).await;
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

    // 3. HTTP on the dev server's app (authorizer middleware + routers), with a trivial route.
    let (http_entry, http_trivial) = match http(b, open_id, rejected.users, sizes).await {
        Ok((e, t)) => (Some(e), Some(t)),
        Err(e) => {
            eprintln!("  ! HTTP section failed: {e:#}");
            (None, None)
        }
    };

    // 4. Accepted purchases with their SQS send, against bare sends on the same emulator.
    let (accepted_router, sqs_bare_send) = match accepted(b, sqs, queue_url, sizes).await {
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
        in_process: rejected.in_process,
        bare_script: rejected.bare_script,
        sold_out_router: sold_out.router,
        sold_out_bare_script: sold_out.bare_script,
        http_entry,
        http_trivial,
        accepted_router,
        sqs_bare_send,
    })
}

/// Section 1's rows: refusals that reach Redis.
struct Rejections {
    /// Users already in the sale's user set.
    users: usize,
    in_process: Measure,
    in_process_with_build: Measure,
    bare_script: Measure,
}

/// 1. Rejections that reach Redis: already_purchased (not short-circuited by the sold-out
///    cache: the activity has plenty of stock). 10k users, all already in the user set.
async fn rejections(b: &Bench, open_id: i64, sizes: &Sizes) -> anyhow::Result<Rejections> {
    let (c, n) = (sizes.concurrency, sizes.rejections);
    let users = b.users.len().min(10_000);
    let sale = open_activity(open_id, 1_000_000);
    seckill_shared::testing::load_without_db(&b.redis, &sale, Duration::from_secs(3600)).await?;
    add_users(b, open_id, users).await?;
    // Warm-up (discarded): the router's connection, the script cache, runtime threads.
    let warm = n.min(10_000);
    let code = Refusal::AlreadyPurchased.code();
    let purchased = Refusal::AlreadyPurchased.script_code();
    router_loop(b, "warm-up: router", open_id, users, warm, c, code, false).await?;
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
    let in_process = router_loop(b, what, open_id, users, n, c, code, true).await?;
    let what = "entry in-process + request build (already_purchased)";
    let in_process_with_build = router_loop(b, what, open_id, users, n, c, code, false).await?;
    let what = "bare EVALSHA (already_purchased)";
    let bare_script = bare_loop(b, what, open_id, users, n, c, purchased).await?;
    Ok(Rejections {
        users,
        in_process,
        in_process_with_build,
        bare_script,
    })
}

/// Section 2's rows: the sold-out flood.
struct SoldOut {
    router: Measure,
    router_with_build: Measure,
    bare_script: Measure,
}

/// 2. The sold-out flood: an activity with no stock left.
async fn sold_out(b: &Bench, sizes: &Sizes) -> anyhow::Result<SoldOut> {
    let (c, n, users) = (sizes.concurrency, sizes.sold_out, b.users.len());
    let id = 2;
    let sale = open_activity(id, 0);
    seckill_shared::testing::load_without_db(&b.redis, &sale, Duration::from_secs(3600)).await?;
    let what = "entry in-process, sold out (cache warm)";
    let code = Refusal::SoldOut { stock_left: 0 }.code();
    let router = router_loop(b, what, id, users, n, c, code, true).await?;
    let what = "entry in-process + request build, sold out";
    let router_with_build = router_loop(b, what, id, users, n, c, code, false).await?;
    let what = "bare EVALSHA (sold_out)";
    let sold_out = Refusal::SoldOut { stock_left: 0 }.script_code();
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
        let req = testing::request(
            "POST",
            "/activities/1/orders",
            Some((&user, "")),
            Some(BODY),
        );
        std::hint::black_box(req);
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

async fn add_users(b: &Bench, activity_id: i64, n: usize) -> anyhow::Result<()> {
    let k = b.redis.keys(activity_id);
    let mut con = b.admin.clone();
    for chunk in b.users[..n].chunks(1000) {
        let mut hset = redis::cmd("HSET");
        hset.arg(&k.users);
        for user in chunk {
            hset.arg(user).arg(Uuid::now_v7().to_string());
        }
        let _: i64 = hset.query_async(&mut con).await?;
    }
    Ok(())
}

/// Calls the router in-process. With `prebuilt`, the requests (with their API Gateway
/// context) are built before the timed loop, in rounds of at most 25k, so only the router and
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
    prebuilt: bool,
) -> anyhow::Result<Measure> {
    let path = Arc::new(format!("/activities/{activity_id}/orders"));
    let mut admin = b.admin.clone();
    let before = util::commandstats(&mut admin).await?;
    let round = if prebuilt { 25_000 } else { attempts };
    let mut total: Option<Run> = None;
    let mut done = 0;
    while done < attempts {
        let n = round.min(attempts - done);
        let offset = done;
        let requests: Arc<Vec<std::sync::Mutex<Option<Request<Body>>>>> = Arc::new(if prebuilt {
            (0..n)
                .map(|i| {
                    let user = &b.users[(offset + i) % user_count];
                    std::sync::Mutex::new(Some(testing::request(
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
                testing::request("POST", &path, Some((user, "")), Some(BODY))
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
    let mut admin = b.admin.clone();
    let before = util::commandstats(&mut admin).await?;
    let run = util::run_tasks(concurrency, attempts, move |i| {
        let mut cm = cm.clone();
        let k = k.clone();
        let users = users.clone();
        let sha = sha.clone();
        let request_ids = request_ids.clone();
        async move {
            let r: redis::RedisResult<(i64, i64, i64, i64)> = redis::cmd("EVALSHA")
                .arg(sha.as_str())
                .arg(3)
                .arg(&k.meta)
                .arg(&k.users)
                .arg(&k.ledger)
                .arg(&users[i % user_count])
                .arg(1)
                .arg(&request_ids[i])
                .arg(sale::far_deadline())
                .query_async(&mut cm)
                .await;
            match r {
                Ok((c, _, _, _)) if c == code => Outcome::Refused,
                Ok((c, _, _, _)) => Outcome::Error(format!("script answered {c}, expected {code}")),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    let after = util::commandstats(&mut admin).await?;
    Ok(Measure::from_run(
        what,
        &run,
        concurrency,
        Some(util::commands_between(&before, &after)),
    ))
}

/// The dev server's app (the same authorizer middleware and routers `make serve` runs) on
/// 127.0.0.1:0, plus a trivial route behind the same middleware.
async fn http(
    b: &Bench,
    activity_id: i64,
    user_count: usize,
    sizes: &Sizes,
) -> anyhow::Result<(Measure, Measure)> {
    let secret = "bench-secret-local-only";
    let functions = seckill_devserver::Functions::connect(&b.config).await?;
    let noop = Router::new().route("/bench/noop", get(|| async { "ok" }));
    let app = seckill_devserver::app(
        functions.entry.clone().merge(noop),
        functions.admin.clone(),
        JwtVerifier::new(secret)?,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let token_count = user_count.min(2_000);
    let tokens: Arc<Vec<String>> = Arc::new(
        b.users[..token_count]
            .iter()
            .map(|u| mint(secret, u, "", 3600))
            .collect::<anyhow::Result<_>>()?,
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(sizes.concurrency)
        .build()?;
    let c = sizes.concurrency;

    let entry_url = Arc::new(format!("http://{addr}/activities/{activity_id}/orders"));
    let (client, t) = (http.clone(), tokens.clone());
    let mut admin = b.admin.clone();
    let before = util::commandstats(&mut admin).await?;
    let run = util::run_tasks(c, sizes.http, move |i| {
        let (client, t, url) = (client.clone(), t.clone(), entry_url.clone());
        async move {
            let r = client
                .post(url.as_str())
                .bearer_auth(&t[i % t.len()])
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await;
            match r {
                Ok(resp) if resp.status().as_u16() == 409 => {
                    let _ = resp.bytes().await;
                    Outcome::Refused
                }
                Ok(resp) => Outcome::Error(format!("status {}", resp.status())),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    let after = util::commandstats(&mut admin).await?;
    let entry = Measure::from_run(
        "HTTP dev server: POST orders (already_purchased)",
        &run,
        c,
        Some(util::commands_between(&before, &after)),
    );

    let noop_url = Arc::new(format!("http://{addr}/bench/noop"));
    let (client, t) = (http.clone(), tokens.clone());
    let run = util::run_tasks(c, sizes.http, move |i| {
        let (client, t, url) = (client.clone(), t.clone(), noop_url.clone());
        async move {
            match client
                .get(url.as_str())
                .bearer_auth(&t[i % t.len()])
                .send()
                .await
            {
                Ok(resp) if resp.status().is_success() => {
                    let _ = resp.bytes().await;
                    Outcome::Refused
                }
                Ok(resp) => Outcome::Error(format!("status {}", resp.status())),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    let trivial = Measure::from_run("HTTP dev server: trivial route (same auth)", &run, c, None);
    server.abort();
    Ok((entry, trivial))
}

async fn accepted(
    b: &Bench,
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    sizes: &Sizes,
) -> anyhow::Result<(Measure, Measure)> {
    let n = sizes.sqs_sends;
    let c = sizes.sqs_concurrency;
    let activity_id = 3;
    seckill_shared::testing::load_without_db(
        &b.redis,
        &open_activity(activity_id, n as i64 + 10),
        Duration::from_secs(3600),
    )
    .await?;
    // Users no other section used for this activity: every request is accepted.
    let router = b.router.clone();
    let users = b.users.clone();
    let path = Arc::new(format!("/activities/{activity_id}/orders"));
    let run = util::run_tasks(c, n, move |i| {
        let (router, users, path) = (router.clone(), users.clone(), path.clone());
        async move {
            let req = testing::request("POST", &path, Some((&users[i], "")), Some(BODY));
            match router.oneshot(req).await {
                Ok(resp) if resp.status().as_u16() == 202 => Outcome::Sold,
                Ok(resp) => {
                    let status = resp.status();
                    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                        .await
                        .unwrap_or_default();
                    Outcome::Error(format!("{status} {}", String::from_utf8_lossy(&body)))
                }
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
    })
    .await;
    let accepted = Measure::from_run("entry in-process, accepted (+ SQS send)", &run, c, None);

    // The same number of sends, same concurrency, on a fresh queue of the same emulator.
    let bare_url = testing::fresh_queue(sqs, 30, 5).await?;
    let body = Arc::new(serde_json::to_string(&OrderMessage {
        request_id: Uuid::now_v7(),
        activity_id,
        user_id: b.users[0].clone(),
        quantity: 1,
        reserved_at_ms: chrono::Utc::now().timestamp_millis(),
        load_epoch: Some(1),
    })?);
    let (client, url) = (sqs.clone(), Arc::new(bare_url.clone()));
    let run = util::run_tasks(c, n, move |_| {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        async move {
            match client
                .send_message()
                .queue_url(url.as_str())
                .message_body(body.as_str())
                .send()
                .await
            {
                Ok(_) => Outcome::Sold,
                Err(e) => Outcome::Error(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()),
            }
        }
    })
    .await;
    let bare = Measure::from_run("bare SendMessage (same emulator)", &run, c, None);
    delete_queue(sqs, &bare_url).await;
    let _ = queue_url;
    Ok((accepted, bare))
}

async fn delete_queue(sqs: &aws_sdk_sqs::Client, url: &str) {
    for u in [url.to_string(), testing::dlq_url(url)] {
        let _ = sqs.delete_queue().queue_url(u).send().await;
    }
}
