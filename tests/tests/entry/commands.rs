//! What a purchase costs Redis: at most six commands, a refusal at most three, and a sold-out
//! one sale's refusal one, counted inside the scripts, for a caller that carries the sale's
//! terms; one without them pays one read more.

use seckill_shared::store::purchase;
use std::time::Duration;
use testkit::PrivateRedis;
use uuid::Uuid;

/// Where the sale stands when a counted purchase runs.
#[derive(Clone, Copy, Debug)]
enum Window {
    Open,
    NotStarted,
    Ended,
    NotLoaded,
}

/// What ran before the counted purchase.
#[derive(Clone, Copy, Debug)]
enum Before {
    Nothing,
    /// The same user bought with another request.
    OtherRequest,
    /// The same request's script already ran (a delivery twice).
    SameRequest,
    /// Bob bought the sale's last unit.
    SoldOut,
    /// The same request's script already ran and took the last unit.
    SameRequestTookTheLast,
}

/// One outcome of `purchase.lua` and the most Redis commands it may run.
struct Counted {
    outcome: &'static str,
    window: Window,
    stock: i64,
    quantity: i64,
    past_deadline: bool,
    before: Before,
    /// The caller carries the sale's terms (else it has none, as a container's first call).
    carried: bool,
    max_commands: u64,
}

#[rustfmt::skip]
const COUNTED: &[Counted] = &[
    Counted { outcome: "accepted", window: Window::Open, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, carried: true, max_commands: 6 },
    Counted { outcome: "not_found", window: Window::NotLoaded, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, carried: true, max_commands: 3 },
    Counted { outcome: "expired", window: Window::Open, stock: 5, quantity: 1, past_deadline: true, before: Before::Nothing, carried: true, max_commands: 3 },
    Counted { outcome: "not_started", window: Window::NotStarted, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, carried: true, max_commands: 3 },
    Counted { outcome: "ended", window: Window::Ended, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, carried: true, max_commands: 3 },
    Counted { outcome: "quantity_exceeds_limit", window: Window::Open, stock: 5, quantity: 3, past_deadline: false, before: Before::Nothing, carried: true, max_commands: 3 },
    Counted { outcome: "sold_out", window: Window::Open, stock: 1, quantity: 2, past_deadline: false, before: Before::Nothing, carried: true, max_commands: 3 },
    Counted { outcome: "already_purchased", window: Window::Open, stock: 5, quantity: 1, past_deadline: false, before: Before::OtherRequest, carried: true, max_commands: 3 },
    Counted { outcome: "accepted", window: Window::Open, stock: 5, quantity: 1, past_deadline: false, before: Before::SameRequest, carried: true, max_commands: 3 },
    // A sale of one bucket, first come, first served, with nothing left: sold out from the
    // meta's one read, whatever else would refuse (here the deadline or the limit), and the
    // delivery twice of the purchase that took the last unit, as before.
    Counted { outcome: "sold_out", window: Window::Open, stock: 1, quantity: 1, past_deadline: false, before: Before::SoldOut, carried: true, max_commands: 1 },
    Counted { outcome: "sold_out", window: Window::Open, stock: 1, quantity: 1, past_deadline: true, before: Before::SoldOut, carried: true, max_commands: 1 },
    Counted { outcome: "sold_out", window: Window::Open, stock: 1, quantity: 3, past_deadline: false, before: Before::SoldOut, carried: true, max_commands: 1 },
    Counted { outcome: "sold_out", window: Window::Open, stock: 1, quantity: 1, past_deadline: false, before: Before::SameRequestTookTheLast, carried: true, max_commands: 1 },
    // No terms carried: the meta's five fields read too, and the answer carries them.
    Counted { outcome: "accepted", window: Window::Open, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, carried: false, max_commands: 7 },
    Counted { outcome: "sold_out", window: Window::Open, stock: 1, quantity: 1, past_deadline: false, before: Before::SoldOut, carried: false, max_commands: 3 },
    Counted { outcome: "ended", window: Window::Ended, stock: 5, quantity: 1, past_deadline: false, before: Before::Nothing, carried: false, max_commands: 3 },
];

/// The commands scripts ran since the last `CONFIG RESETSTAT`: every command `INFO
/// commandstats` counts but the ones that only carry or load a script and read the count.
async fn commands_inside_scripts(
    con: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await?;
    let outside = ["info", "config", "evalsha", "eval", "script"];
    let mut sum = 0;
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if outside.contains(&name) || name.starts_with("config|") || name.starts_with("script|") {
            continue;
        }
        let calls = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .ok_or_else(|| anyhow::anyhow!("no calls in {line}"))?;
        sum += calls.parse::<u64>()?;
    }
    Ok(sum)
}

/// Every outcome of the purchase script, run once on a server of this test's own right after
/// `CONFIG RESETSTAT`: a success costs at most six commands, any refusal at most three (they
/// are the bulk of a sale's traffic), and a refusal of a sold-out sale one, the terms carried;
/// without them, one more (and a sold-out refusal takes the whole way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_runs_at_most_six_commands_a_refusal_three_and_sold_out_one(
) -> anyhow::Result<()> {
    let private = PrivateRedis::start().await;
    let env = private
        .env(Duration::from_secs(2), Duration::from_secs(1))
        .await;
    let mut con = private.raw().await?;
    let now = chrono::Utc::now();
    let mut counted = Vec::new();
    for case in COUNTED {
        let hour = chrono::Duration::hours(1);
        let (start, end) = match case.window {
            Window::Open | Window::NotLoaded => (now - hour, now + hour),
            Window::NotStarted => (now + hour, now + hour * 2),
            Window::Ended => (now - hour * 2, now - hour),
        };
        let a = env.activity(case.stock, 2, start, end).await?;
        if matches!(case.window, Window::NotLoaded) {
            testkit::lose_activity(&env.redis, a.id).await?;
        }
        let request_id = Uuid::new_v4();
        let earlier = match case.before {
            Before::Nothing => None,
            Before::OtherRequest => Some(("alice", Uuid::new_v4())),
            Before::SameRequest | Before::SameRequestTookTheLast => Some(("alice", request_id)),
            Before::SoldOut => Some(("bob", Uuid::new_v4())),
        };
        if let Some((buyer, earlier)) = earlier {
            let first = testkit::purchase(
                &env.redis,
                a.id,
                buyer,
                1,
                earlier,
                purchase::far_deadline(),
            );
            anyhow::ensure!(
                first.await?.is_ok(),
                "{}: the earlier purchase",
                case.outcome
            );
        }
        // The terms as the entry carries them once a call answered them, or none.
        match purchase::read_terms(&env.redis, a.id.into()).await? {
            Some(terms) if case.carried => env.redis.terms.put(a.id, terms.text()),
            _ => env.redis.terms.forget(a.id),
        }
        let deadline = if case.past_deadline {
            0
        } else {
            purchase::far_deadline()
        };
        // The script is cached from the earlier runs: only its own commands are counted.
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut con)
            .await?;
        let decision = testkit::purchase(
            &env.redis,
            a.id,
            "alice",
            case.quantity,
            request_id,
            deadline,
        )
        .await?;
        let commands = commands_inside_scripts(&mut con).await?;
        let outcome = match decision {
            Ok(_) => "accepted",
            Err(refusal) => refusal.code(),
        };
        counted.push(format!(
            "{} after {:?}{}: {commands}",
            case.outcome,
            case.before,
            if case.carried { "" } else { ", no terms" }
        ));
        assert_eq!(outcome, case.outcome, "{:?} {:?}", case.window, case.before);
        // Whatever the call carried, the handle now holds the meta's terms.
        let held = env.redis.terms.get(a.id).map(|t| t.text().to_string());
        let meta = purchase::read_terms(&env.redis, a.id.into()).await?;
        assert_eq!(held, meta.map(|t| t.text().to_string()), "{}", case.outcome);
        assert!(
            commands <= case.max_commands,
            "{} ({:?}, {:?}) ran {commands} commands, more than {}",
            case.outcome,
            case.window,
            case.before,
            case.max_commands
        );
    }
    eprintln!("commands per outcome: {counted:?}");
    Ok(())
}
