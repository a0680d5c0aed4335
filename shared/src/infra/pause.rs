//! Named pause points: where a test stops one actor between two of its steps, runs another
//! actor, and then lets the first one go on.
//!
//! The protocol in `docs/invariants.md` is a set of steps per actor (entry, consumer, cancel,
//! reconcile, admin, preheat), each atomic on its own. What can go wrong is an interleaving
//! of those steps, and real concurrency hits a given interleaving only by luck. A pause point
//! makes it happen on purpose:
//!
//! ```ignore
//! let paused = pause::arm("cancel.before_begin", activity_id);   // in the test
//! let b = tokio::spawn(cancel_order(..));                       // stops at the point
//! paused.reached().await;
//! cancel_order(..).await?;                                      // another actor runs
//! paused.resume();                                              // the first one goes on
//! ```
//!
//! Code names its steps with [`point`] (await it) and its injectable failures with [`fail`]
//! (a `true` means "behave as if this step failed"). Both are scoped by a key (the activity
//! id, usually), so tests running side by side in one process never stop each other.
//!
//! Without the `failpoints` feature both compile to nothing: release builds and the Lambda
//! binaries carry no registry, no lock and no branch. Only the tests crate enables it.

use std::fmt::Display;

#[cfg(feature = "failpoints")]
pub use armed::{arm, arm_after, arm_failure, count, Paused};

/// A named step of the protocol. Pauses here while a test holds this point armed for `scope`.
#[inline(always)]
pub async fn point(name: &'static str, scope: impl Display) {
    #[cfg(feature = "failpoints")]
    armed::hit(name, &scope.to_string()).await;
    #[cfg(not(feature = "failpoints"))]
    let _ = (name, scope);
}

/// An injectable failure: `true` when a test armed `name` to fail for `scope`.
#[inline(always)]
pub fn fail(name: &'static str, scope: impl Display) -> bool {
    #[cfg(feature = "failpoints")]
    return armed::should_fail(name, &scope.to_string());
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = (name, scope);
        false
    }
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, LazyLock, Mutex};
    use tokio::sync::{watch, Semaphore};

    enum Action {
        /// Pass `skip` hits through, then stop the next one until resumed.
        Pause { skip: AtomicU32 },
        /// Fail the next `times` hits.
        Fail { times: AtomicU32 },
        /// Stop nothing: count every hit.
        Count,
    }

    struct Point {
        action: Action,
        /// How many hits stopped here so far.
        reached: watch::Sender<u32>,
        resume: Semaphore,
    }

    type Registry = Mutex<HashMap<(&'static str, String), Arc<Point>>>;
    static POINTS: LazyLock<Registry> = LazyLock::new(|| Mutex::new(HashMap::new()));

    fn lookup(name: &'static str, scope: &str) -> Option<Arc<Point>> {
        let points = POINTS.lock().unwrap_or_else(|p| p.into_inner());
        points.get(&(name, scope.to_string())).cloned()
    }

    pub(super) async fn hit(name: &'static str, scope: &str) {
        let Some(p) = lookup(name, scope) else { return };
        let skip = match &p.action {
            Action::Pause { skip } => skip,
            Action::Count => return p.reached.send_modify(|n| *n += 1),
            Action::Fail { .. } => return,
        };
        // The first hit past the skipped ones stops; every later hit passes.
        let mut stop = false;
        let _ = skip.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
            0 => {
                stop = true;
                Some(u32::MAX)
            }
            u32::MAX => None,
            n => Some(n - 1),
        });
        if stop {
            tracing::debug!(name, scope, "paused");
            p.reached.send_modify(|n| *n += 1);
            if let Ok(permit) = p.resume.acquire().await {
                permit.forget();
            }
        }
    }

    pub(super) fn should_fail(name: &'static str, scope: &str) -> bool {
        let Some(p) = lookup(name, scope) else {
            return false;
        };
        let Action::Fail { times } = &p.action else {
            return false;
        };
        let failed = times
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failed {
            p.reached.send_modify(|n| *n += 1);
        }
        failed
    }

    fn register(name: &'static str, scope: String, action: Action) -> Paused {
        let point = Arc::new(Point {
            action,
            reached: watch::channel(0).0,
            resume: Semaphore::new(0),
        });
        POINTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((name, scope.clone()), point.clone());
        Paused { name, scope, point }
    }

    /// Stops the first hit of `name` for `scope` until [`Paused::resume`] (or the handle drops).
    pub fn arm(name: &'static str, scope: impl std::fmt::Display) -> Paused {
        arm_after(name, scope, 0)
    }

    /// Lets `skip` hits of `name` for `scope` pass, then stops the next one.
    pub fn arm_after(name: &'static str, scope: impl std::fmt::Display, skip: u32) -> Paused {
        let skip = AtomicU32::new(skip);
        register(name, scope.to_string(), Action::Pause { skip })
    }

    /// Makes the next `times` calls of [`fail`](super::fail) for `name` and `scope` answer true.
    pub fn arm_failure(name: &'static str, scope: impl std::fmt::Display, times: u32) -> Paused {
        let times = AtomicU32::new(times);
        register(name, scope.to_string(), Action::Fail { times })
    }

    /// Counts the hits of `name` for `scope` ([`Paused::hits`]) and stops none: how many times
    /// an actor took a step.
    pub fn count(name: &'static str, scope: impl std::fmt::Display) -> Paused {
        register(name, scope.to_string(), Action::Count)
    }

    /// A test's hold on an armed point. Dropping it disarms the point and lets a stopped
    /// actor go on, so a failing test never leaves a task stuck.
    pub struct Paused {
        name: &'static str,
        scope: String,
        point: Arc<Point>,
    }

    impl Paused {
        /// Waits until an actor stopped at (or failed through) the point.
        pub async fn reached(&self) {
            let mut rx = self.point.reached.subscribe();
            let _ = rx.wait_for(|n| *n > 0).await;
        }

        /// Waits up to `limit` for [`Paused::reached`]; false if nothing got there.
        pub async fn reached_within(&self, limit: std::time::Duration) -> bool {
            tokio::time::timeout(limit, self.reached()).await.is_ok()
        }

        /// How many actors stopped at (or failed through) the point so far.
        pub fn hits(&self) -> u32 {
            *self.point.reached.borrow()
        }

        /// Lets the stopped actor go on.
        pub fn resume(&self) {
            self.point.resume.add_permits(1);
        }
    }

    impl Drop for Paused {
        fn drop(&mut self) {
            let mut points = POINTS.lock().unwrap_or_else(|p| p.into_inner());
            let key = (self.name, std::mem::take(&mut self.scope));
            if points
                .get(&key)
                .is_some_and(|p| Arc::ptr_eq(p, &self.point))
            {
                points.remove(&key);
            }
            self.point.resume.add_permits(Semaphore::MAX_PERMITS / 2);
        }
    }
}
