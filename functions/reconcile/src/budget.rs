//! The run's time: its budget, counted from the invocation's start and never past the
//! invocation's deadline less a margin, and the shares its steps take of it (the release, then
//! each due sale, whose draw part takes half of the sale's). docs/invariants.md, "Reconcile".

use std::time::{Duration, Instant};

/// How long before the invocation's deadline nothing new starts: room for the last call in
/// flight (a statement runs up to the role's 5 s timeout) and the report. At most a fifth of
/// the time to the deadline, for a short one.
pub const FINISH_MARGIN: Duration = Duration::from_secs(5);

/// The part of the budget the release of unpaid orders may take at most (a quarter): the
/// sales' checks get the rest, and whatever the release leaves.
const RELEASE_PART: u32 = 4;

/// The least time a due sale gets of a run, however many sales share it: enough for one
/// chunk of each walk.
const MIN_SHARE: Duration = Duration::from_secs(1);

/// One run's time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    started: Instant,
    /// When the run's work stops: the configured budget after the start, or the hard end if
    /// that comes first.
    end: Instant,
    /// The deadline less the margin: nothing starts after it, not even a step's least work.
    hard: Instant,
    /// The configured budget, for the sales' floor.
    budget: Duration,
}

impl Budget {
    /// A run that starts now with `budget`, whose invocation ends at `deadline`.
    pub fn starting_now(budget: Duration, deadline: Instant) -> Self {
        let started = Instant::now();
        let to_deadline = deadline.saturating_duration_since(started);
        let hard = started + to_deadline - FINISH_MARGIN.min(to_deadline / 5);
        Self {
            started,
            end: (started + budget).min(hard),
            hard,
            budget,
        }
    }

    /// The release's share: up to a quarter of the budget from the start.
    pub fn release(&self) -> Share {
        let part = self.end.saturating_duration_since(self.started) / RELEASE_PART;
        Share {
            until: self.started + part,
            hard: self.hard,
        }
    }

    /// The share of the `i`-th of `n` due sales, starting now: an even part of what is left of
    /// the budget, never less than [`MIN_SHARE`] (or the whole budget when it is shorter: then
    /// each walk does its one chunk), never past the hard end. `None`: the sale waits for the
    /// next run, which checks it first. The first sale of a run starts whatever is left of the
    /// budget (so a run checks one sale at least), unless the hard end has passed.
    pub fn sale(&self, i: usize, n: usize) -> Option<Share> {
        let now = Instant::now();
        let left = self.end.saturating_duration_since(now);
        if now >= self.hard || (left.is_zero() && i > 0) {
            return None;
        }
        let floor = MIN_SHARE.min(self.budget);
        let share = (left / n.saturating_sub(i).max(1) as u32).max(floor);
        Some(Share {
            until: (now + share).min(self.hard),
            hard: self.hard,
        })
    }
}

/// A step's share of the run: when it stops (after its least work), and the run's hard end,
/// after which nothing starts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Share {
    pub until: Instant,
    pub hard: Instant,
}

impl Share {
    /// Whether the share is spent: a step that has done its least work stops.
    pub fn spent(&self) -> bool {
        Instant::now() >= self.until
    }

    /// Whether the run's hard end has passed: nothing more starts, least work included.
    pub fn over(&self) -> bool {
        Instant::now() >= self.hard
    }

    /// The first half of what is left of this share, for a sale's draw part (the checks get
    /// the rest).
    pub fn first_half(&self) -> Share {
        let now = Instant::now();
        Share {
            until: now + self.until.saturating_duration_since(now) / 2,
            hard: self.hard,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_never_reaches_past_the_deadline_less_the_margin() {
        let deadline = Instant::now() + Duration::from_secs(60);
        let b = Budget::starting_now(Duration::from_secs(40), deadline);
        assert!(b.end <= b.started + Duration::from_secs(40));
        assert_eq!(b.hard, deadline - FINISH_MARGIN);

        let soon = Instant::now() + Duration::from_secs(30);
        let late = Budget::starting_now(Duration::from_secs(40), soon);
        assert_eq!(
            (late.end, late.hard),
            (soon - FINISH_MARGIN, soon - FINISH_MARGIN)
        );

        // A run whose deadline is its budget (`run(now)`): a fifth of it is the margin.
        let short = Budget::starting_now(
            Duration::from_secs(1),
            Instant::now() + Duration::from_secs(1),
        );
        let worked = short.end - short.started;
        assert!(
            worked <= Duration::from_millis(800) && worked > Duration::from_millis(700),
            "{worked:?}"
        );
    }

    #[test]
    fn the_release_takes_a_quarter_and_the_sales_share_the_rest() {
        let b = Budget::starting_now(
            Duration::from_secs(40),
            Instant::now() + Duration::from_secs(60),
        );
        let release = b.release().until - b.started;
        assert!(release <= Duration::from_secs(10), "{release:?}");
        let first = b.sale(0, 4).unwrap();
        let share = first.until - Instant::now();
        assert!(
            share <= Duration::from_secs(10) && share > Duration::from_secs(9),
            "{share:?}"
        );
    }

    #[test]
    fn past_the_budget_only_the_first_sale_starts_and_past_the_hard_end_none() {
        let spent = Budget::starting_now(
            Duration::from_millis(1),
            Instant::now() + Duration::from_secs(60),
        );
        std::thread::sleep(Duration::from_millis(2));
        assert!(spent.sale(0, 2).is_some(), "the first sale starts");
        assert!(spent.sale(1, 2).is_none(), "the next one waits");

        let over = Budget::starting_now(
            Duration::from_millis(1),
            Instant::now() + Duration::from_millis(1),
        );
        std::thread::sleep(Duration::from_millis(2));
        assert!(over.sale(0, 1).is_none(), "nothing past the hard end");
        assert!(over.release().over());
    }
}
