//! The draw's fairness: no advantage to early arrivals where first come gives them all (the
//! winners' arrival ranks against uniform), and a draw anyone can check: the revealed secret
//! reproduces every ticket and the winners through the verifier.

use crate::enter;
use axum::http::StatusCode;
use axum::Router;
use futures::StreamExt;
use seckill_shared::domain::activity::Activity;
use seckill_shared::protocol::purchase::Outcome;
use seckill_shared::store::draw;
use seckill_shared::store::draw::Drawn;
use seckill_shared::store::view;
use seckill_shared::Refusal;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use testkit::call;
use testkit::close_draw_window;
use testkit::on_every_redis;
use testkit::request;
use testkit::RedisKind;
use testkit::TestEnv;

on_every_redis!(the_revealed_secret_reproduces_every_ticket_and_the_winners_through_the_verifier,);

const ENTRANTS: usize = 2_000;
const STOCK: i64 = 200;
/// Rank bins of the chi-square test, and its critical value at p = 0.001 for 9 degrees of
/// freedom.
const BINS: usize = 10;
const CHI2_CRITICAL: f64 = 27.877;

/// Pearson's chi-square of the winners' arrival ranks (1..=ENTRANTS) over equal bins.
fn chi_square(ranks: &[i64]) -> f64 {
    let mut counts = [0f64; BINS];
    for &r in ranks {
        counts[((r - 1) as usize * BINS) / ENTRANTS] += 1.0;
    }
    let expected = ranks.len() as f64 / BINS as f64;
    counts
        .iter()
        .map(|c| (c - expected).powi(2) / expected)
        .sum()
}

/// A draw sale of STOCK units with ENTRANTS entrants, arriving one after the other: the arrival
/// rank of each winner after its draw (each sale has its own ticket secret).
async fn winners_of_a_draw(env: &TestEnv) -> anyhow::Result<Vec<i64>> {
    let a = env.draw_activity(STOCK, 1).await?;
    for i in 0..ENTRANTS {
        let entered = enter(env, a.id, &format!("u{i}")).await;
        assert_eq!(entered, Outcome::Queued { rank: i as i64 + 1 });
    }
    close_draw_window(env, a.id).await;
    let drawn = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert_eq!(
        drawn,
        Drawn::Now {
            winners: STOCK,
            units: STOCK,
            entrants: ENTRANTS as i64
        }
    );
    let pool = draw::pool(&env.redis, a.id).await?;
    let mut ranks: Vec<i64> = pool
        .iter()
        .filter(|(_, e)| e.won)
        .map(|(_, e)| e.rank)
        .collect();
    ranks.sort();
    assert_eq!(ranks.len() as i64, STOCK);
    assert_eq!(view::stock(&env.redis, a.id).await?, Some(0));
    Ok(ranks)
}

/// 2,000 entrants in a known arrival order for 200 units. First come, first served: the
/// first 200 arrivals win, and the chi-square of their ranks is far past any critical value.
/// A draw: the winners' ranks pass the chi-square test, and over 20 sales (20 secrets) the
/// mean winning rank and the early arrivals' share of the wins are what chance gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_draw_gives_no_advantage_to_early_arrivals_where_first_come_gives_them_all() {
    let env = TestEnv::new(RedisKind::Standalone).await.unwrap();

    let fcfs = env.open_activity(STOCK, 1).await.unwrap();
    let mut fcfs_ranks = Vec::new();
    for i in 0..ENTRANTS {
        match enter(&env, fcfs.id, &format!("u{i}")).await {
            Outcome::Reserved(_) => fcfs_ranks.push(i as i64 + 1),
            Outcome::Refused(Refusal::SoldOut { .. }) => {}
            other => panic!("first come, first served answered {other:?}"),
        }
    }
    assert_eq!(fcfs_ranks, (1..=STOCK).collect::<Vec<_>>());
    let fcfs_chi2 = chi_square(&fcfs_ranks);
    assert!(fcfs_chi2 > 1_000.0, "first come: chi-square {fcfs_chi2}");

    let ranks = winners_of_a_draw(&env).await.unwrap();
    let chi2 = chi_square(&ranks);
    assert!(
        chi2 < CHI2_CRITICAL,
        "draw: chi-square {chi2} over {ranks:?}"
    );

    // Twenty draws: 4,000 winning ranks. Uniform ranks 1..=2000 have mean 1000.5 and standard
    // deviation 577.35; drawn without replacement (200 of 2,000 per sale) the mean of 4,000
    // has a standard error of 577.35 * sqrt(1800/1999) / sqrt(4000) = 8.66. The first tenth
    // of the arrivals wins a tenth of the draws: 400 of 4,000, standard error sqrt(360) = 19.
    let draws = futures::stream::iter(1..=20u32)
        .map(|_| winners_of_a_draw(&env))
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
    let all: Vec<i64> = draws.into_iter().flat_map(|d| d.unwrap()).collect();
    assert_eq!(all.len(), 4_000);
    let mean = all.iter().sum::<i64>() as f64 / all.len() as f64;
    assert!(
        (mean - 1000.5).abs() < 4.0 * 8.66,
        "mean winning rank {mean}"
    );
    let early = all.iter().filter(|&&r| r <= 200).count() as f64;
    println!(
        "first come: chi-square {fcfs_chi2:.0}; one draw: chi-square {chi2:.2} \
         (critical {CHI2_CRITICAL}); 20 draws: mean winning rank {mean:.1} (1000.5), \
         first tenth won {early} of 4000 (400)"
    );
    assert!(
        (early - 400.0).abs() < 4.0 * 19.0,
        "early arrivals won {early} of 4000"
    );
}

/// Each entrant's ticket as `scripts/draw_verify.py` recomputes it from the revealed secret,
/// after checking the secret against the commitment (it exits non-zero on a mismatch).
fn verified_tickets(secret: &str, commitment: &str, users: &[String]) -> HashMap<String, i64> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("python3")
        .arg(root.join("scripts/draw_verify.py"))
        .args(["--secret", secret, "--commitment", commitment, "--json"])
        .args(users)
        .output()
        .expect("python3 runs scripts/draw_verify.py");
    assert!(
        out.status.success(),
        "the verifier refused: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the verifier's JSON")
}

/// Every ticket in the sale's `tickets`, by user (the sentinel left out).
pub async fn tickets(env: &TestEnv, activity_id: i64) -> HashMap<String, i64> {
    let k = env.redis.keys(activity_id);
    let flat: Vec<(String, f64)> = env
        .redis
        .cmd(
            redis::cmd("ZRANGE")
                .arg(&k.tickets)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        )
        .await
        .unwrap();
    flat.into_iter()
        .filter(|(user, _)| !user.is_empty())
        .map(|(user, score)| (user, score as i64))
        .collect()
}

/// The public view's `draw`.
async fn public_draw(app: &Router, a: &Activity) -> Value {
    let (status, body) = call(
        app,
        request("GET", &format!("/activities/{}", a.id), None, None),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["draw"].clone()
}

/// The draw is verifiable: from its creation the public view shows the SHA-256 of the ticket
/// secret and nothing else of it; after the draw it shows the secret and the cutoff, and the
/// verifier recomputes from them every entrant's ticket as Redis holds it, and the winners
/// are exactly the entrants with the lowest tickets, each at or below the cutoff, every
/// loser above it.
async fn the_revealed_secret_reproduces_every_ticket_and_the_winners_through_the_verifier(
    kind: RedisKind,
) -> anyhow::Result<()> {
    let env = TestEnv::new(kind).await?;
    let app = env.entry_router();
    let a = env.draw_activity(40, 1).await?;
    let before = public_draw(&app, &a).await;
    let commitment = before["commitment"]
        .as_str()
        .expect("a commitment")
        .to_string();
    assert_eq!(commitment.len(), 64, "{before}");
    assert!(
        before.get("secret").is_none() && before.get("cutoff").is_none(),
        "{before}"
    );

    let users: Vec<String> = (0..300).map(|i| format!("entrant-{i}")).collect();
    for (i, user) in users.iter().enumerate() {
        assert_eq!(
            enter(&env, a.id, user).await,
            Outcome::Queued { rank: i as i64 + 1 }
        );
    }
    let held = tickets(&env, a.id).await;
    assert_eq!(held.len(), users.len());
    // Before the draw the view still hides the secret, also with the window closed.
    close_draw_window(&env, a.id).await;
    assert!(public_draw(&app, &a).await.get("secret").is_none());

    let drawn = draw::draw(&env.redis, a.id, Duration::MAX).await?;
    assert_eq!(
        drawn,
        Drawn::Now {
            winners: 40,
            units: 40,
            entrants: 300
        }
    );
    // The view caches for up to 250 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = public_draw(&app, &a).await;
    assert_eq!(after["commitment"], before["commitment"], "{after}");
    let secret = after["secret"]
        .as_str()
        .expect("the secret, revealed")
        .to_string();
    let cutoff = after["cutoff"].as_i64().expect("the cutoff");

    let verified = verified_tickets(&secret, &commitment, &users);
    assert_eq!(
        verified, held,
        "the verifier's tickets are the ones Redis drew with"
    );
    let mut by_ticket: Vec<(&i64, &String)> = verified.iter().map(|(u, t)| (t, u)).collect();
    by_ticket.sort();
    let lowest: HashSet<&String> = by_ticket.iter().take(40).map(|(_, u)| *u).collect();
    let won: HashSet<&String> = draw::pool(&env.redis, a.id)
        .await?
        .iter()
        .filter(|(_, e)| e.won)
        .filter_map(|(user, _)| users.iter().find(|u| *u == user))
        .collect();
    assert_eq!(won, lowest, "the winners are the 40 lowest tickets");
    for (user, t) in &verified {
        assert_eq!(
            *t <= cutoff,
            won.contains(user),
            "{user}: ticket {t}, cutoff {cutoff}"
        );
    }
    // A wrong secret is caught by the commitment.
    let wrong = "00".repeat(32);
    let out = std::process::Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/draw_verify.py"))
        .args(["--secret", &wrong, "--commitment", &commitment, "alice"])
        .output()?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}
