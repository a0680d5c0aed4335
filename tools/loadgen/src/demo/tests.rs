//! The demo's report (printed text, report.json) built from fixed figures, compared byte for
//! byte with the committed files in `golden/`. When a change to the text is meant, regenerate them with
//! `UPDATE_GOLDEN=1 cargo test -p seckill-loadgen demo` and commit the new files on their own.

use super::admission::{self, DrawReport, Fairness, Polled};
use super::{build_report, BucketFacts, DemoOptions, DemoReport, StoreFacts};
use crate::chart::{self, Arrivals, Entrant, StockSample};
use crate::load::{self, Answer, Bucket, Class, Latency, LoadReport, Plan, Shot, Timeline, User};
use clap::Parser;
use seckill_shared::domain::settings::Admission;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn opts() -> DemoOptions {
    DemoOptions {
        stock: 500,
        per_order_limit: 1,
        buckets: 1,
        admission: Admission::Fcfs,
        draw_window: Duration::from_millis(2_000),
        users: 5_000,
        requests: 20_000,
        concurrency: 256,
        opens_in: Duration::from_secs(3),
        early: Duration::from_millis(150),
        bad_ratio: 0.01,
        seed: 42,
        jwt_secret: "secret".into(),
        out_dir: PathBuf::from("/tmp/demo"),
        drain_timeout: Duration::from_secs(180),
        sqs_timeout: Duration::from_secs(15),
        quiet: true,
        config: seckill_shared::Config::try_parse_from([
            "seckill-demo",
            "--database-url=postgres://demo@127.0.0.1/demo",
            "--redis-url=redis://127.0.0.1:6379",
            "--order-queue-url=http://127.0.0.1:4567/000000000000/demo",
        ])
        .unwrap(),
    }
}

fn load() -> LoadReport {
    LoadReport {
        requests: 20_000,
        concurrency: 256,
        elapsed_secs: 4.6275,
        throughput: 4_321.987,
        requests_by_outcome: [
            ("accepted".to_string(), 500),
            ("not_started".to_string(), 256),
            ("sold_out".to_string(), 19_044),
            ("unauthorized".to_string(), 200),
        ]
        .into(),
        requests_by_kind: [("no_token".to_string(), 200), ("valid".to_string(), 19_800)].into(),
        latency: Latency {
            p50_ms: 12.345,
            p95_ms: 45.678,
            p99_ms: 99.999,
            max_ms: 250.5,
            mean_ms: 20.0,
        },
        timeline: crowd_timeline().buckets(),
        started_at: "2025-01-02T03:04:05Z".into(),
        answers: Vec::new(),
    }
}

/// A crowd of two seconds, as the workers would record it: an opening rush that sells out within
/// 300 ms, then the sold-out flood thinning out, with a few early, bad and failed requests.
fn crowd_timeline() -> Timeline {
    let mut t = Timeline::default();
    let mut at = |ms: u64, micros: u64, class: Class, n: u64| {
        for i in 0..n {
            t.record(
                Duration::from_millis(ms) + Duration::from_micros(i),
                micros + i,
                class,
            );
        }
    };
    at(5, 900, Class::Refused, 3); // not_started: the crowd starts 150 ms early
    at(20, 1_200, Class::Rejected, 2);
    at(110, 4_000, Class::Accepted, 300);
    at(150, 8_000, Class::SoldOut, 40);
    at(250, 6_000, Class::Accepted, 200);
    at(260, 9_000, Class::SoldOut, 200);
    at(399, 2_500_000, Class::Failed, 1);
    for bucket in 3..20 {
        at(
            bucket * 100 + 30,
            700 + bucket,
            Class::SoldOut,
            400 - 20 * bucket,
        );
    }
    t
}

#[test]
fn a_two_second_crowd_is_drawn_from_twenty_buckets_of_100_ms() {
    let buckets = crowd_timeline().buckets();
    assert_eq!(buckets.len(), 20);
    let starts: Vec<u64> = buckets.iter().map(|b| b.start_ms).collect();
    assert_eq!(starts, (0..20).map(|i| i * 100).collect::<Vec<_>>());
    assert_eq!(
        buckets[1],
        Bucket {
            start_ms: 100,
            requests: 340,
            accepted: 300,
            sold_out: 40,
            p99_ms: 8.039,
            ..Bucket::default()
        }
    );
    assert_eq!((buckets[2].accepted, buckets[3].failed), (200, 1));
    // The chart puts each bucket at its middle (in ms here, to compare whole numbers).
    let accepted: Vec<(i64, f64)> = chart::points(&buckets, |b| b.accepted as f64)
        .into_iter()
        .map(|(t, n)| ((t * 1000.0).round() as i64, n))
        .collect();
    assert_eq!(&accepted[..3], &[(50, 0.0), (150, 300.0), (250, 200.0)]);
}

#[test]
fn the_chart_of_a_two_second_crowd_renders() {
    let path = std::env::temp_dir().join(format!("seckill-chart-{}.png", std::process::id()));
    let samples = [sample(-0.1, &[500]), sample(0.2, &[200]), sample(0.3, &[0])];
    assert_chart_renders(&path, &samples);
}

#[test]
fn the_chart_of_a_sale_in_three_buckets_renders_a_line_per_bucket() {
    let path =
        std::env::temp_dir().join(format!("seckill-chart-buckets-{}.png", std::process::id()));
    let samples = [
        sample(-0.1, &[167, 167, 166]),
        sample(0.2, &[40, 90, 70]),
        sample(0.3, &[0, 10, 0]),
        sample(0.4, &[0, 0, 0]),
    ];
    assert_chart_renders(&path, &samples);
}

/// A stock sample from each bucket's units (the total is their sum).
fn sample(t: f64, buckets: &[i64]) -> StockSample {
    StockSample {
        t,
        stock: buckets.iter().sum(),
        buckets: buckets.to_vec(),
    }
}

fn assert_chart_renders(path: &std::path::Path, samples: &[StockSample]) {
    chart::draw(
        path,
        "two seconds",
        &crowd_timeline().buckets(),
        samples,
        500,
        None,
    )
    .expect("chart renders");
    let size = std::fs::metadata(path).expect("chart written").len();
    let _ = std::fs::remove_file(path);
    assert!(
        size > 10_000,
        "a 1200x900 PNG with three panels, got {size} bytes"
    );
}

fn store() -> StoreFacts {
    StoreFacts {
        orders: 500,
        units_sold: 500,
        failed_orders: 2,
        duplicate_users: 0,
        db_total_stock: 500,
        db_remaining_stock: 0,
        redis_stock: Some(0),
        redis_participants: 500,
        pending_qty: 0,
        pending_count: 0,
        transfer_qty: 0,
        redis_nodes: Vec::new(),
        buckets: vec![bucket(0, "42", 8_000, None, 0, 500)],
    }
}

fn bucket(
    index: u32,
    tag: &str,
    slot: u32,
    node: Option<&str>,
    stock: i64,
    participants: i64,
) -> BucketFacts {
    BucketFacts {
        index,
        tag: tag.into(),
        slot,
        node: node.map(str::to_string),
        stock: Some(stock),
        participants,
    }
}

/// The same sale in three buckets on the 3-master cluster, each bucket on its own master.
fn bucketed_store() -> StoreFacts {
    let nodes = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"];
    StoreFacts {
        redis_nodes: nodes.iter().map(|n| n.to_string()).collect(),
        buckets: vec![
            bucket(0, "42", 8_000, Some(nodes[1]), 0, 170),
            bucket(1, "42.1of3.2", 13_500, Some(nodes[2]), 0, 163),
            bucket(2, "42.2of3.0", 2_300, Some(nodes[0]), 0, 167),
        ],
        ..store()
    }
}

fn report(store: StoreFacts, drained: bool) -> DemoReport {
    let buckets = store.buckets.len();
    let samples = if buckets == 1 {
        vec![sample(-0.1, &[500]), sample(0.9, &[0])]
    } else {
        vec![sample(-0.1, &[167, 167, 166]), sample(0.9, &[0, 0, 0])]
    };
    build_report(
        42,
        &opts(),
        load(),
        store,
        drained,
        1.25,
        serde_json::json!({ "activityId": 42, "drift": 0 }),
        samples,
        "/tmp/demo/chart.png".into(),
    )
}

/// Compares `actual` with `golden/<name>`, or writes it there under `UPDATE_GOLDEN=1`.
fn assert_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/demo/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert_eq!(expected, actual, "{} differs", path.display());
}

#[test]
fn report_of_a_sale_that_came_out_right_matches_the_golden_files() {
    let report = report(store(), true);
    assert!(report.ok());
    assert_golden("sale-ok.txt", &report.text());
    let json = serde_json::to_string_pretty(&report).expect("report serializes");
    assert_golden("sale-ok.json", &json);
}

#[test]
fn report_of_a_sale_in_three_buckets_lists_each_bucket_and_its_node() {
    let report = report(bucketed_store(), true);
    assert!(report.ok());
    assert_golden("sale-buckets.txt", &report.text());
}

/// Units on their way between two buckets count towards the total.
#[test]
fn units_in_transfer_between_buckets_are_conserved() {
    let store = StoreFacts {
        redis_stock: Some(0),
        units_sold: 497,
        orders: 497,
        db_remaining_stock: 3,
        transfer_qty: 3,
        ..bucketed_store()
    };
    let report = report(store, true);
    assert!(report.conservation_ok, "{}", report.conservation);
    assert!(report.conservation.contains("+ in transfer 3 +"));
}

/// Oversold, a user with two orders, the Redis stock gone, the queue not drained.
#[test]
fn report_of_a_sale_that_went_wrong_matches_the_golden_file() {
    let store = StoreFacts {
        orders: 502,
        units_sold: 503,
        duplicate_users: 1,
        db_remaining_stock: -3,
        redis_stock: None,
        pending_qty: 2,
        pending_count: 2,
        ..store()
    };
    let report = report(store, false);
    assert!(!report.ok());
    assert_golden("sale-failed.txt", &report.text());
}

#[test]
fn a_draw_sale_in_more_than_one_bucket_is_refused_with_the_reason() {
    let draw = DemoOptions {
        admission: Admission::Draw,
        buckets: 3,
        ..opts()
    };
    let e = draw.check().expect_err("draw with buckets 3 is refused");
    let message = e.to_string();
    assert!(
        message.contains("--admission draw cannot be combined with --buckets 3"),
        "{message}"
    );
    assert!(DemoOptions { buckets: 1, ..draw }.check().is_ok());
    let fcfs = DemoOptions {
        buckets: 3,
        ..opts()
    };
    assert!(fcfs.check().is_ok());
}

#[test]
fn a_queued_answer_is_its_own_outcome_and_class() {
    let queued = br#"{"requestId":"0190a0a0-0000-7000-8000-000000000000","status":"queued"}"#;
    let pending = br#"{"requestId":"0190a0a0-0000-7000-8000-000000000000","status":"pending"}"#;
    assert_eq!(load::outcome(202, queued), "queued");
    assert_eq!(load::outcome(202, pending), "accepted");
    assert_eq!(load::outcome(202, b""), "accepted");
    assert_eq!(Class::of(Some(202), "queued"), Class::Queued);
    assert_eq!(Class::of(Some(202), "accepted"), Class::Accepted);
}

/// `n` entrants in rank order, those whose rank `won` says winning, each arriving 1 ms after
/// the one before.
fn entrants(n: i64, won: impl Fn(i64) -> bool) -> Vec<Entrant> {
    (1..=n)
        .map(|rank| Entrant {
            rank,
            at: Some(rank as f64 / 1000.0),
            won: won(rank),
        })
        .collect()
}

/// `winners` drawn from `n` entrants by a seeded shuffle.
fn drawn_at_random(n: usize, winners: usize) -> Vec<Entrant> {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let picked: std::collections::HashSet<i64> = rand::seq::index::sample(&mut rng, n, winners)
        .into_iter()
        .map(|i| i as i64 + 1)
        .collect();
    entrants(n as i64, |rank| picked.contains(&rank))
}

#[test]
fn winners_drawn_at_random_pass_the_chi_square_and_the_earliest_arrivals_do_not() {
    let even = Fairness::of(&entrants(1_000, |rank| rank % 10 == 3));
    assert_eq!((even.chi_square, even.degrees_of_freedom), (0.0, 9));
    assert_eq!(even.critical_value, 27.88);
    assert!(even.uniform);
    assert_eq!(even.uniform_mean_rank, 500.5);
    assert!((even.first_tenth_winner_share - 0.1).abs() < 1e-9);

    let random = Fairness::of(&drawn_at_random(1_000, 100));
    assert!(random.uniform, "chi-square {}", random.chi_square);
    assert!((random.mean_winning_rank - 500.5).abs() < 60.0);

    let earliest = Fairness::of(&entrants(1_000, |rank| rank <= 100));
    assert!(!earliest.uniform);
    assert_eq!(earliest.mean_winning_rank, 50.5);
    assert_eq!(earliest.first_tenth_winner_share, 1.0);
    // All 100 in the first tenth (10 expected), none in the other nine: 81·10 + 9·10.
    assert_eq!(earliest.chi_square, 900.0);
}

#[test]
fn when_every_entrant_wins_there_is_nothing_to_test() {
    let all = Fairness::of(&entrants(300, |_| true));
    assert_eq!((all.chi_square, all.degrees_of_freedom), (0.0, 9));
    assert!(all.uniform);
    let none = Fairness::of(&entrants(300, |_| false));
    assert_eq!(none.degrees_of_freedom, 0);
    assert!(none.uniform);
}

#[test]
fn a_first_come_sale_ranks_each_buyer_by_their_first_answer_after_the_opening() {
    let token: Arc<str> = Arc::from("t");
    let shot = |user: Option<usize>, kind| Shot {
        path: "/activities/42/orders".into(),
        token: user.map(|_| token.clone()),
        body: "{\"quantity\":1}".into(),
        kind,
        user,
    };
    let plan = Plan {
        shots: vec![
            shot(Some(0), "valid"),
            shot(Some(1), "valid"),
            shot(Some(0), "valid"),
            shot(Some(1), "zero_quantity"),
            shot(None, "no_token"),
        ],
        users: ["u0", "u1"]
            .iter()
            .map(|id| User {
                id: id.to_string(),
                token: token.clone(),
            })
            .collect(),
    };
    let answer = |shot, ms, outcome: &str| Answer {
        shot,
        at: Duration::from_millis(ms),
        outcome: outcome.into(),
    };
    let load = LoadReport {
        answers: vec![
            answer(2, 200, "accepted"),
            answer(0, 50, "not_started"),
            answer(3, 60, "bad_request"),
            answer(1, 100, "sold_out"),
            answer(4, 90, "unauthorized"),
        ],
        ..load()
    };
    let got = admission::first_come(&plan, &load, 0.15);
    let at = |e: &Entrant| (e.at.unwrap() * 1000.0).round() as i64;
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].rank, at(&got[0]), got[0].won), (1, -50, false));
    assert_eq!((got[1].rank, at(&got[1]), got[1].won), (2, 50, true));
}

#[test]
fn the_chart_with_arrivals_adds_a_fourth_panel() {
    let path =
        std::env::temp_dir().join(format!("seckill-chart-arrivals-{}.png", std::process::id()));
    let arrivals = Arrivals {
        caption: "draw: pool entrants by arrival".into(),
        entrants: drawn_at_random(1_000, 100),
        window_close: Some(1.0),
    };
    let samples = [sample(-0.1, &[100]), sample(1.1, &[0])];
    chart::draw(
        &path,
        "a draw",
        &crowd_timeline().buckets(),
        &samples,
        100,
        Some(&arrivals),
    )
    .expect("chart renders");
    let png = std::fs::read(&path).expect("chart written");
    let _ = std::fs::remove_file(&path);
    // The PNG header's IHDR: width, then height, big-endian, from byte 16.
    let size = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    assert_eq!((size(16), size(20)), (1200, 1200));
}

/// The crowd of a draw sale: its first two seconds queued (one answer per entrant), repeats
/// already_purchased, the rest sold out once the draw took the stock.
fn draw_load() -> LoadReport {
    LoadReport {
        requests_by_outcome: [
            ("already_purchased".to_string(), 3_900),
            ("not_started".to_string(), 256),
            ("queued".to_string(), 4_480),
            ("sold_out".to_string(), 11_164),
            ("unauthorized".to_string(), 200),
        ]
        .into(),
        ..load()
    }
}

fn draw_report() -> DrawReport {
    let fairness = Fairness::of(&drawn_at_random(4_480, 500));
    DrawReport {
        window_ms: 2_000,
        entrants: 4_480,
        queued_responses: 4_480,
        winners: 500,
        winner_units: 500,
        polled: Polled {
            users: 4_480,
            rounds: 2,
            secs: 1.25,
            by_status: [
                ("confirmed".to_string(), 500),
                ("not_drawn".to_string(), 3_980),
            ]
            .into(),
            all_final: true,
        },
        fairness,
    }
}

#[test]
fn report_of_a_draw_sale_matches_the_golden_file() {
    let mut report = build_report(
        42,
        &DemoOptions {
            admission: Admission::Draw,
            ..opts()
        },
        draw_load(),
        store(),
        true,
        0.5,
        serde_json::json!({ "activityId": 42, "drift": 0 }),
        vec![sample(-0.1, &[500]), sample(2.2, &[0])],
        "/tmp/demo/chart.png".into(),
    );
    report.draw = Some(draw_report());
    assert!(report.ok());
    assert_golden("sale-draw.txt", &report.text());
}

#[test]
fn a_draw_with_an_entrant_still_queued_or_favouring_early_arrivals_is_not_ok() {
    let with = |draw: DrawReport| DemoReport {
        draw: Some(draw),
        ..report(store(), true)
    };
    let mut queued = draw_report();
    queued.polled.by_status = [
        ("confirmed".to_string(), 500),
        ("not_drawn".to_string(), 3_979),
        ("queued".to_string(), 1),
    ]
    .into();
    queued.polled.all_final = false;
    assert!(!with(queued).ok());
    let biased = DrawReport {
        fairness: Fairness::of(&entrants(1_000, |rank| rank <= 100)),
        ..draw_report()
    };
    assert!(!with(biased).ok());
    assert!(with(draw_report()).ok());
}
