//! How the demo's sale admitted its buyers, and whether a draw's winners look drawn at random.
//!
//! A draw sale (`--admission draw`) answers the crowd's purchases in its window `queued`. Once
//! the window has closed, `settle` has every pool entrant ask `GET /activities/{id}/orders/me`
//! until their status is final (`confirmed` for a winner once the consumer wrote the order,
//! `not_drawn` for the rest), while reconcile, the drawer, runs each second as its schedule
//! would (it draws, records and sends the winners), then reads the pool back from Redis: each entrant's arrival rank
//! and whether they won. [`Fairness`] compares the winners' ranks with a uniform draw.
//!
//! For a first-come sale, [`first_come`] builds the same arrivals from the crowd's answers
//! alone (each buyer's first answer after the opening), so the chart shows the contrast: its
//! winners are the earliest arrivals.

use super::{say, CreatedActivity, DemoOptions, Stage};
use crate::chart::{self, Entrant, Slice};
use crate::load::{LoadReport, Plan};
use anyhow::Context;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Statuses of `orders/me` that do not change by themselves.
pub const FINAL: [&str; 6] = [
    "confirmed",
    "paid",
    "cancelled",
    "failed",
    "not_drawn",
    "entered_late",
];

/// The value a chi-square statistic with 1 to 9 degrees of freedom exceeds with probability
/// 0.001 under the hypothesis (here: a uniform draw).
pub const CHI_SQUARE_P001: [f64; 9] = [
    10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88,
];

/// Status requests in flight at once while polling.
const POLL_CONCURRENCY: usize = 64;
/// Pause between two rounds of polling the entrants not yet final.
const POLL_PAUSE: Duration = Duration::from_millis(200);
/// How often the demo runs reconcile (the drawer) while a draw's entrants poll.
const DRAWER_EVERY: Duration = Duration::from_secs(1);

/// What a draw sale's pool became.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrawReport {
    pub window_ms: u64,
    /// Users in the pool (Redis), and the crowd's `queued` answers (one per entrant).
    pub entrants: u64,
    pub queued_responses: u64,
    /// Entrants the draw picked, and the units they took.
    pub winners: u64,
    pub winner_units: i64,
    pub polled: Polled,
    pub fairness: Fairness,
}

impl DrawReport {
    /// `not_drawn` answers counted by the poll.
    pub fn not_drawn(&self) -> u64 {
        self.polled.count("not_drawn")
    }

    /// Every entrant final, each winner's order in (`confirmed`, or `paid`), and every other
    /// entrant `not_drawn`.
    pub fn settled(&self) -> bool {
        self.polled.all_final
            && self.polled.count("confirmed") + self.polled.count("paid") == self.winners
            && self.winners + self.not_drawn() == self.entrants
    }

    /// Settled, and the winners' ranks consistent with a uniform draw.
    pub fn ok(&self) -> bool {
        self.settled() && self.fairness.uniform
    }

    /// The report's lines about the draw, each check with its verdict.
    pub fn write(&self, o: &mut String) {
        let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
        let _ = writeln!(
            o,
            "draw            {} entrants in a {} ms window ({} queued answers), {} winners ({} units), {} not_drawn",
            self.entrants,
            self.window_ms,
            self.queued_responses,
            self.winners,
            self.winner_units,
            self.not_drawn()
        );
        let p = &self.polled;
        let statuses: Vec<String> = p
            .by_status
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        let _ = writeln!(
            o,
            "entrants polled {} until final in {} rounds, {:.1} s: {}  [{}]",
            p.users,
            p.rounds,
            p.secs,
            statuses.join(", "),
            verdict(self.settled())
        );
        let f = &self.fairness;
        let _ = writeln!(
            o,
            "fairness        winners' mean arrival rank {:.1} (uniform: (N+1)/2 = {:.1}); the first 10% of arrivals hold {:.1}% of the winners (uniform: {:.1}%)",
            f.mean_winning_rank,
            f.uniform_mean_rank,
            100.0 * f.first_tenth_winner_share,
            100.0 * f.first_tenth_entrant_share
        );
        let _ = writeln!(
            o,
            "chi-square      {:.2} over 10 rank bins of the winners, {} degrees of freedom (p = 0.001 critical value {:.2})  [{}]",
            f.chi_square,
            f.degrees_of_freedom,
            f.critical_value,
            verdict(f.uniform)
        );
    }
}

/// Every entrant's status after asking until it was final, or until the deadline.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Polled {
    pub users: usize,
    pub rounds: u32,
    pub secs: f64,
    /// Each user's last status (`unanswered`: no 200 came back).
    pub by_status: BTreeMap<String, u64>,
    pub all_final: bool,
}

impl Polled {
    fn count(&self, status: &str) -> u64 {
        self.by_status.get(status).copied().unwrap_or(0)
    }
}

/// One tenth of the pool by arrival rank (the first: the earliest).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tenth {
    pub entrants: u64,
    pub winners: u64,
    /// The winners a uniform draw gives it: its share of the entrants times all the winners.
    pub uniform: f64,
}

/// The winners' arrival ranks against a uniform draw, where every entrant is as likely to
/// win whenever they arrived.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fairness {
    pub mean_winning_rank: f64,
    /// `(N + 1) / 2`, the mean rank of winners drawn uniformly from ranks 1 to N.
    pub uniform_mean_rank: f64,
    /// The earliest tenth's share of the winners, and of the entrants.
    pub first_tenth_winner_share: f64,
    pub first_tenth_entrant_share: f64,
    pub tenths: Vec<Tenth>,
    /// Σ (winners − uniform)² / uniform over the tenths.
    pub chi_square: f64,
    /// The tenths with a uniform share above 0, less one.
    pub degrees_of_freedom: usize,
    /// [`CHI_SQUARE_P001`] at those degrees of freedom (0 with none).
    pub critical_value: f64,
    /// The chi-square stays under the critical value: a uniform draw exceeds it once in a
    /// thousand sales, a draw that favours early (or late) arrivals nearly always.
    pub uniform: bool,
}

impl Fairness {
    pub fn of(entrants: &[Entrant]) -> Self {
        let n = entrants.len() as u64;
        let winners: Vec<i64> = entrants.iter().filter(|e| e.won).map(|e| e.rank).collect();
        let w = winners.len() as u64;
        let share = |part: u64, whole: u64| {
            if whole == 0 {
                0.0
            } else {
                part as f64 / whole as f64
            }
        };
        let tenths: Vec<Tenth> = chart::by_rank_tenth(entrants)
            .iter()
            .map(|&s: &Slice| Tenth {
                entrants: s.entrants,
                winners: s.winners,
                uniform: s.uniform(n, w),
            })
            .collect();
        let counted: Vec<&Tenth> = tenths.iter().filter(|t| t.uniform > 0.0).collect();
        let chi_square = counted
            .iter()
            .map(|t| (t.winners as f64 - t.uniform).powi(2) / t.uniform)
            .sum();
        let degrees_of_freedom = counted.len().saturating_sub(1);
        let critical_value = degrees_of_freedom
            .checked_sub(1)
            .and_then(|i| CHI_SQUARE_P001.get(i))
            .copied()
            .unwrap_or(0.0);
        Self {
            mean_winning_rank: share(winners.iter().sum::<i64>().max(0) as u64, w),
            uniform_mean_rank: (n as f64 + 1.0) / 2.0,
            first_tenth_winner_share: share(tenths[0].winners, w),
            first_tenth_entrant_share: share(tenths[0].entrants, n),
            uniform: degrees_of_freedom == 0 || chi_square < critical_value,
            tenths,
            chi_square,
            degrees_of_freedom,
            critical_value,
        }
    }
}

/// Seconds from the crowd's first request to the sale's opening (negative when the crowd
/// started late), to put the answers on the sale's clock.
pub fn opening_offset(load: &LoadReport, start_at: DateTime<Utc>) -> f64 {
    DateTime::parse_from_rfc3339(&load.started_at)
        .map(|started| (start_at - started.with_timezone(&Utc)).as_seconds_f64())
        .unwrap_or(0.0)
}

/// Waits for the draw window to close, has every pool entrant ask for their status until it
/// is final, and reads the pool back: the report and each entrant for the chart.
pub(super) async fn settle(
    stage: &Stage,
    opts: &DemoOptions,
    activity: &CreatedActivity,
    plan: &Plan,
    load: &LoadReport,
) -> anyhow::Result<(DrawReport, Vec<Entrant>)> {
    let closes = activity.start_at + chrono::Duration::from_std(opts.draw_window)?;
    if let Ok(wait) = (closes - Utc::now()).to_std() {
        say(
            opts,
            &format!(
                "waiting {:.1} s for the draw window to close",
                wait.as_secs_f64()
            ),
        );
        tokio::time::sleep(wait).await;
    }
    let pool = seckill_shared::store::draw::pool(&stage.redis, activity.id)
        .await
        .context("reading the draw's pool")?;
    let index: HashMap<&str, usize> = plan
        .users
        .iter()
        .enumerate()
        .map(|(i, u)| (u.id.as_str(), i))
        .collect();
    let tokens: Vec<Arc<str>> = pool
        .iter()
        .filter_map(|(user, _)| {
            index
                .get(user.as_str())
                .map(|&i| plan.users[i].token.clone())
        })
        .collect();
    anyhow::ensure!(
        tokens.len() == pool.len(),
        "the pool holds users the crowd does not know"
    );
    say(
        opts,
        &format!(
            "{} entrants ask for their status until it is final",
            tokens.len()
        ),
    );
    // The drawer is reconcile, on its schedule: the demo runs it each second while the
    // entrants poll (its run after the drain then finds nothing left to draw or send).
    let drawer = async {
        loop {
            if let Err(e) = stage.server.functions().reconcile(Utc::now()).await {
                say(opts, &format!("reconcile failed: {e:#}"));
            }
            tokio::time::sleep(DRAWER_EVERY).await;
        }
    };
    let polled = tokio::select! {
        polled = poll_until_final(stage, activity.id, &tokens, opts.drain_timeout) => polled,
        () = drawer => unreachable!("the drawer runs until the poll ends"),
    };
    // Read again: the draw ran meanwhile and marked its winners.
    let pool = seckill_shared::store::draw::pool(&stage.redis, activity.id)
        .await
        .context("reading the draw's pool")?;
    let at = queued_at(plan, load, opening_offset(load, activity.start_at));
    let mut entrants: Vec<Entrant> = pool
        .iter()
        .map(|(user, e)| Entrant {
            rank: e.rank,
            at: index.get(user.as_str()).and_then(|i| at.get(i)).copied(),
            won: e.won,
        })
        .collect();
    entrants.sort_by_key(|e| e.rank);
    let report = DrawReport {
        window_ms: opts.draw_window.as_millis() as u64,
        entrants: entrants.len() as u64,
        queued_responses: load.requests_by_outcome.get("queued").copied().unwrap_or(0),
        winners: pool.iter().filter(|(_, e)| e.won).count() as u64,
        winner_units: pool
            .iter()
            .filter(|(_, e)| e.won)
            .map(|(_, e)| e.quantity)
            .sum(),
        polled,
        fairness: Fairness::of(&entrants),
    };
    Ok((report, entrants))
}

/// When each user's `queued` answer came back, in seconds since the opening, by user index.
fn queued_at(plan: &Plan, load: &LoadReport, offset: f64) -> HashMap<usize, f64> {
    load.answers
        .iter()
        .filter(|a| a.outcome == "queued")
        .filter_map(|a| Some((plan.shots[a.shot].user?, a.at.as_secs_f64() - offset)))
        .collect()
}

/// Asks `orders/me` for each token until every answer is one of [`FINAL`] or the timeout
/// passes; a round asks only those not final yet.
async fn poll_until_final(
    stage: &Stage,
    activity_id: i64,
    tokens: &[Arc<str>],
    timeout: Duration,
) -> Polled {
    let started = Instant::now();
    let url = format!("{}/activities/{activity_id}/orders/me", stage.base);
    let mut last: Vec<Option<String>> = vec![None; tokens.len()];
    let mut open: Vec<usize> = (0..tokens.len()).collect();
    let mut rounds = 0;
    while !open.is_empty() {
        rounds += 1;
        let answers: Vec<(usize, Option<String>)> = futures::stream::iter(open.iter().copied())
            .map(|i| {
                let (http, url, token) = (&stage.http, &url, &tokens[i]);
                async move { (i, my_status(http, url, token).await) }
            })
            .buffer_unordered(POLL_CONCURRENCY)
            .collect()
            .await;
        for (i, status) in answers {
            if status.is_some() {
                last[i] = status;
            }
        }
        open.retain(|&i| !last[i].as_deref().is_some_and(|s| FINAL.contains(&s)));
        if open.is_empty() || started.elapsed() > timeout {
            break;
        }
        tokio::time::sleep(POLL_PAUSE).await;
    }
    let mut by_status = BTreeMap::new();
    for status in &last {
        *by_status
            .entry(status.clone().unwrap_or_else(|| "unanswered".into()))
            .or_default() += 1;
    }
    Polled {
        users: tokens.len(),
        rounds,
        secs: started.elapsed().as_secs_f64(),
        by_status,
        all_final: open.is_empty(),
    }
}

/// The `status` of one `orders/me` answer; `None` for anything but a 200 with one.
async fn my_status(http: &reqwest::Client, url: &str, token: &str) -> Option<String> {
    let resp = http.get(url).bearer_auth(token).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body: serde_json::Value = resp.json().await.ok()?;
    body.get("status")?.as_str().map(str::to_string)
}

/// A first-come sale's arrivals from the crowd's answers: each user with a token by their
/// first answer after the opening (not `not_started`, not a bad request), in that order;
/// a winner is a user with an `accepted` answer.
pub fn first_come(plan: &Plan, load: &LoadReport, offset: f64) -> Vec<Entrant> {
    let mut answers: Vec<_> = load
        .answers
        .iter()
        .filter_map(|a| {
            let shot = &plan.shots[a.shot];
            let user = shot.user.filter(|_| shot.kind == "valid")?;
            Some((a.at, user, a.outcome.as_str()))
        })
        .collect();
    answers.sort_by_key(|&(at, user, _)| (at, user));
    let won: std::collections::HashSet<usize> = answers
        .iter()
        .filter(|(_, _, outcome)| *outcome == "accepted")
        .map(|&(_, user, _)| user)
        .collect();
    let mut seen = std::collections::HashSet::new();
    answers
        .iter()
        .filter(|(_, _, outcome)| *outcome != "not_started")
        .filter(|&&(_, user, _)| seen.insert(user))
        .enumerate()
        .map(|(i, &(at, user, _))| Entrant {
            rank: i as i64 + 1,
            at: Some(at.as_secs_f64() - offset),
            won: won.contains(&user),
        })
        .collect()
}
