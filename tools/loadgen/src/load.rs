//! The load generator: many concurrent HTTP clients, each request carrying its user's JWT.
//!
//! A [`Plan`] is the list of requests to make, decided up front (so a run is reproducible from
//! its seed and the generator does no thinking on the hot path). [`run`] fires it with a fixed
//! number of workers over a pooled, keep-alive client, and counts what came back: outcome (HTTP
//! status plus the JSON `error` code), latency in an HdrHistogram (µs), a [`Timeline`] of
//! 100 ms buckets (responses by class, p99), so a crowd of two seconds shows its shape, and
//! each response's [`Answer`] (which request, when, what), so a caller can follow one user.

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One request to make.
#[derive(Clone, Debug)]
pub struct Shot {
    pub path: String,
    /// `Authorization: Bearer <token>`; `None` sends no credentials.
    pub token: Option<Arc<str>>,
    pub body: String,
    /// What kind of request this is (`valid`, `malformed_body`, ...), for the report.
    pub kind: &'static str,
    /// The index in [`Plan::users`] of the user whose token this is (`None`: no token).
    pub user: Option<usize>,
}

/// A user of the crowd: their id (the JWT's `sub`) and token.
#[derive(Clone, Debug)]
pub struct User {
    pub id: String,
    pub token: Arc<str>,
}

/// The requests of one run, in firing order, and the users they come from.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub shots: Vec<Shot>,
    pub users: Vec<User>,
}

/// How to build a purchase crowd.
#[derive(Clone, Debug)]
pub struct CrowdSpec {
    pub activity_id: i64,
    pub users: usize,
    pub requests: usize,
    /// Units per valid request.
    pub quantity: i64,
    /// Share of deliberately bad requests (malformed body, bad quantity, no token), 0.0-1.0.
    pub bad_ratio: f64,
    pub seed: u64,
    /// HS256 secret the tokens are signed with.
    pub secret: String,
    /// Prefix of the user ids (`<prefix>-<n>`).
    pub user_prefix: String,
}

impl Plan {
    /// A crowd of purchases against one activity: each request from a random user (so users
    /// repeat, as real crowds hammer the button), with a share of bad requests mixed in.
    pub fn crowd(spec: &CrowdSpec) -> anyhow::Result<Self> {
        anyhow::ensure!(spec.users > 0, "at least one user");
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let users: Vec<User> = (0..spec.users)
            .map(|n| {
                let id = format!("{}-{n}", spec.user_prefix);
                // A buyer's token holds `seckill:user`: only the `no_token` shots are refused.
                let token = seckill_shared::http::auth::mint(
                    &spec.secret,
                    &id,
                    seckill_shared::http::auth::USER_SCOPE,
                    3600,
                )?;
                Ok(User {
                    id,
                    token: Arc::from(token),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let path = format!("/activities/{}/orders", spec.activity_id);
        let good_body = format!("{{\"quantity\":{}}}", spec.quantity);
        let mut shots: Vec<Shot> = (0..spec.requests)
            .map(|i| {
                // Every user gets at least one request before any repeats.
                let user = if i < spec.users {
                    i
                } else {
                    rng.random_range(0..spec.users)
                };
                let token = Some(users[user].token.clone());
                let shot = |body: &str, token: Option<Arc<str>>, kind| Shot {
                    path: path.clone(),
                    user: token.is_some().then_some(user),
                    token,
                    body: body.to_string(),
                    kind,
                };
                if rng.random_bool(spec.bad_ratio.clamp(0.0, 1.0)) {
                    match rng.random_range(0..4) {
                        0 => shot("{\"quantity\":", token, "malformed_body"),
                        1 => shot("{\"quantity\":0}", token, "zero_quantity"),
                        2 => shot("{\"quantity\":1000000}", token, "huge_quantity"),
                        _ => shot(&good_body, None, "no_token"),
                    }
                } else {
                    shot(&good_body, token, "valid")
                }
            })
            .collect();
        shots.shuffle(&mut rng);
        Ok(Self { shots, users })
    }

    /// Number of requests of each kind.
    pub fn kinds(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for s in &self.shots {
            *out.entry(s.kind).or_default() += 1;
        }
        out
    }
}

/// How to fire a plan.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// `http://127.0.0.1:3000` (no trailing slash).
    pub base_url: String,
    pub concurrency: usize,
    pub timeout: Duration,
    /// Hide the progress bar (callers hide it when their output is not a terminal).
    pub quiet: bool,
}

/// Latency percentiles, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Latency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
            mean_ms: h.mean() / 1000.0,
        }
    }
}

/// Width of one [`Bucket`] of the timeline.
pub const BUCKET: Duration = Duration::from_millis(100);

/// How a response counts in the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// 202 `pending`: a unit reserved.
    Accepted,
    /// 202 `queued`: an entry in a draw sale's pool, no unit taken yet.
    Queued,
    /// 409 `sold_out`.
    SoldOut,
    /// Any other business refusal (409 `not_started`, `ended`, `already_purchased`, 429, ...).
    Refused,
    /// Bad input or no valid token (any other 4xx).
    Rejected,
    /// 5xx, a timeout or a transport error: the server did not answer the request properly.
    Failed,
}

impl Class {
    /// The class of a response (`None`: no response at all) and its [`outcome`] name.
    pub fn of(status: Option<u16>, outcome: &str) -> Self {
        match status {
            Some(202) if outcome == "queued" => Class::Queued,
            Some(202) => Class::Accepted,
            Some(409) if outcome == "sold_out" => Class::SoldOut,
            Some(409 | 429) => Class::Refused,
            Some(400..=499) => Class::Rejected,
            _ => Class::Failed,
        }
    }
}

/// One 100 ms of the run, by when its responses came back.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bucket {
    /// Start of the bucket, in ms since the first request.
    pub start_ms: u64,
    pub requests: u64,
    pub accepted: u64,
    /// Only a draw sale's crowd has any (and only then is it in the JSON).
    #[serde(skip_serializing_if = "is_zero")]
    pub queued: u64,
    pub sold_out: u64,
    pub refused: u64,
    pub rejected: u64,
    pub failed: u64,
    pub p99_ms: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Responses counted into [`BUCKET`]-wide buckets; one per worker, merged at the end.
#[derive(Default)]
pub struct Timeline {
    buckets: BTreeMap<u64, (Bucket, Option<Histogram<u64>>)>,
}

impl Timeline {
    /// Counts a response that came back `at` after the first request, after `micros`.
    pub fn record(&mut self, at: Duration, micros: u64, class: Class) {
        let index = (at.as_millis() / BUCKET.as_millis()) as u64;
        let (b, h) = self.buckets.entry(index).or_default();
        b.requests += 1;
        match class {
            Class::Accepted => b.accepted += 1,
            Class::Queued => b.queued += 1,
            Class::SoldOut => b.sold_out += 1,
            Class::Refused => b.refused += 1,
            Class::Rejected => b.rejected += 1,
            Class::Failed => b.failed += 1,
        }
        let _ = h.get_or_insert_with(histogram).record(micros.max(1));
    }

    pub fn merge(&mut self, other: Timeline) {
        for (index, (o, oh)) in other.buckets {
            let (b, h) = self.buckets.entry(index).or_default();
            b.requests += o.requests;
            b.accepted += o.accepted;
            b.queued += o.queued;
            b.sold_out += o.sold_out;
            b.refused += o.refused;
            b.rejected += o.rejected;
            b.failed += o.failed;
            if let Some(oh) = oh {
                let _ = h.get_or_insert_with(histogram).add(&oh);
            }
        }
    }

    /// Every bucket from the first to the last response, the quiet ones as zeros.
    pub fn buckets(&self) -> Vec<Bucket> {
        let last = self.buckets.keys().last().copied().unwrap_or(0);
        let width = BUCKET.as_millis() as u64;
        (0..=last)
            .map(|index| {
                let (b, h) = self.buckets.get(&index).cloned().unwrap_or_default();
                Bucket {
                    start_ms: index * width,
                    p99_ms: h.map_or(0.0, |h| h.value_at_quantile(0.99) as f64 / 1000.0),
                    ..b
                }
            })
            .collect()
    }
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadReport {
    pub requests: u64,
    pub concurrency: usize,
    pub elapsed_secs: f64,
    /// Completed requests per second over the whole run.
    pub throughput: f64,
    /// Outcome (`accepted`, `sold_out`, ..., `http_<status>`, `transport_error`) -> count.
    pub requests_by_outcome: BTreeMap<String, u64>,
    /// Request kind (`valid`, `no_token`, ...) -> count, as planned.
    pub requests_by_kind: BTreeMap<String, u64>,
    pub latency: Latency,
    /// Responses per 100 ms ([`BUCKET`]).
    pub timeline: Vec<Bucket>,
    /// Wall-clock time of the first request (RFC 3339).
    pub started_at: String,
    /// Every response, in no particular order (not in the JSON: one line per request).
    #[serde(skip)]
    pub answers: Vec<Answer>,
}

/// One response: which shot of the plan it answered, when, and how.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Index in [`Plan::shots`].
    pub shot: usize,
    /// When the response came back, after the first request.
    pub at: Duration,
    /// Its [`outcome`] name.
    pub outcome: String,
}

/// Per-worker tallies, merged at the end so the hot path shares nothing but a counter.
struct Tally {
    latency: Histogram<u64>,
    outcomes: BTreeMap<String, u64>,
    timeline: Timeline,
    answers: Vec<Answer>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

impl Tally {
    fn new() -> Self {
        Self {
            latency: histogram(),
            outcomes: BTreeMap::new(),
            timeline: Timeline::default(),
            answers: Vec::new(),
        }
    }

    fn record(
        &mut self,
        shot: usize,
        at: Duration,
        micros: u64,
        status: Option<u16>,
        outcome: String,
    ) {
        let micros = micros.max(1);
        let _ = self.latency.record(micros);
        self.timeline
            .record(at, micros, Class::of(status, &outcome));
        *self.outcomes.entry(outcome.clone()).or_default() += 1;
        self.answers.push(Answer { shot, at, outcome });
    }

    fn merge(&mut self, other: Tally) {
        let _ = self.latency.add(&other.latency);
        for (k, v) in other.outcomes {
            *self.outcomes.entry(k).or_default() += v;
        }
        self.timeline.merge(other.timeline);
        self.answers.extend(other.answers);
    }
}

/// Names a response: `accepted` for a 202 (`queued` for a 202 whose `status` says the purchase
/// is in a draw sale's pool), the JSON `error` code for errors, else `http_<status>`.
pub fn outcome(status: u16, body: &[u8]) -> String {
    let json = serde_json::from_slice::<serde_json::Value>(body);
    if status == 202 {
        let queued = json
            .as_ref()
            .is_ok_and(|v| v.get("status").and_then(|s| s.as_str()) == Some("queued"));
        return if queued { "queued" } else { "accepted" }.into();
    }
    if let Ok(v) = json {
        if let Some(code) = v.get("error").and_then(|c| c.as_str()) {
            return code.to_string();
        }
    }
    if (200..300).contains(&status) {
        "ok".into()
    } else {
        format!("http_{status}")
    }
}

/// A progress bar (on stderr), hidden when asked or when stderr is not a terminal.
pub fn progress_bar(len: u64, quiet: bool, message: &str) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40.cyan/blue}] {pos}/{len} ({per_sec}, {elapsed})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(message.to_string());
    pb
}

/// Fires the plan and measures it. Never fails on a bad response: every response is an outcome.
pub async fn run(plan: &Plan, opts: &RunOptions) -> anyhow::Result<LoadReport> {
    let concurrency = opts.concurrency.max(1);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .tcp_nodelay(true)
        .timeout(opts.timeout)
        .build()?;
    let shots = Arc::new(plan.shots.clone());
    let next = Arc::new(AtomicUsize::new(0));
    let pb = progress_bar(shots.len() as u64, opts.quiet, "purchases");
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339();

    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, shots, next, pb) =
                (client.clone(), shots.clone(), next.clone(), pb.clone());
            let base = opts.base_url.clone();
            tokio::spawn(async move {
                let mut tally = Tally::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(shot) = shots.get(i) else { break };
                    let mut req = client
                        .post(format!("{base}{}", shot.path))
                        .header("content-type", "application/json")
                        .body(shot.body.clone());
                    if let Some(token) = &shot.token {
                        req = req.header("authorization", format!("Bearer {token}"));
                    }
                    let t0 = Instant::now();
                    let (status, outcome) = match req.send().await {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let body = resp.bytes().await.unwrap_or_default();
                            (Some(status), outcome(status, &body))
                        }
                        Err(e) if e.is_timeout() => (None, "timeout".to_string()),
                        Err(_) => (None, "transport_error".to_string()),
                    };
                    let done = Instant::now();
                    let micros = done.duration_since(t0).as_micros() as u64;
                    tally.record(i, done.duration_since(started), micros, status, outcome);
                    pb.inc(1);
                }
                tally
            })
        })
        .collect();

    let mut total = Tally::new();
    for w in workers {
        total.merge(w.await?);
    }
    pb.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    let requests = total.latency.len();
    let timeline = total.timeline.buckets();
    Ok(LoadReport {
        requests,
        concurrency,
        elapsed_secs: elapsed,
        throughput: if elapsed > 0.0 {
            requests as f64 / elapsed
        } else {
            0.0
        },
        requests_by_outcome: total.outcomes,
        requests_by_kind: plan
            .kinds()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        latency: Latency::of(&total.latency),
        timeline,
        started_at,
        answers: total.answers,
    })
}

impl LoadReport {
    /// The human table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "requests      {:>10}   ({} concurrent, {:.2} s)",
            self.requests, self.concurrency, self.elapsed_secs
        );
        let _ = writeln!(out, "throughput    {:>10.0} req/s", self.throughput);
        let l = &self.latency;
        let _ = writeln!(
            out,
            "latency ms    p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2}  mean {:.2}",
            l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms, l.mean_ms
        );
        let _ = writeln!(out, "by outcome");
        for (k, v) in &self.requests_by_outcome {
            let pct = 100.0 * *v as f64 / self.requests.max(1) as f64;
            let _ = writeln!(out, "  {k:<24}{v:>10}  {pct:>5.1}%");
        }
        out
    }
}
