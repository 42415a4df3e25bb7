//! Whether the hot store answers the commands enforcement sends it.
//!
//! Read from those commands' own outcomes: a Redis Cluster answers `PING` from its other
//! nodes while one slot's master is gone and every check on that slot times out (a
//! fail-closed class answers 503 for a third of its accounts).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Failures within [`WINDOW`] that make the hot store unhealthy: one lost command is noise,
/// three (each bounded by the command timeout) is an outage, whatever answered in between.
pub const FAILURES_TO_UNHEALTHY: u32 = 3;

/// How long failures count, and how long the store must go without one to be healthy again.
pub const WINDOW: Duration = Duration::from_secs(1);

/// Milliseconds since the process first asked (only the distance between two readings
/// matters).
fn now_ms() -> u64 {
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    u64::try_from(START.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Outcomes of the hot store's commands; shared by every clone of a connection.
#[derive(Debug)]
pub struct Health {
    /// Failures since `window_start_ms`.
    failures: AtomicU32,
    window_start_ms: AtomicU64,
    last_failure_ms: AtomicU64,
    healthy: AtomicBool,
    store: &'static str,
}

impl Health {
    /// Healthy until commands fail.
    pub fn new(store: &'static str) -> Health {
        Health {
            failures: AtomicU32::new(0),
            window_start_ms: AtomicU64::new(0),
            last_failure_ms: AtomicU64::new(0),
            healthy: AtomicBool::new(true),
            store,
        }
    }

    /// A command was answered: one relaxed load while healthy (the hot path).
    pub fn answered(&self) {
        if !self.healthy.load(Relaxed) {
            self.heal_if_quiet();
        }
    }

    /// A command failed or timed out.
    pub fn failed(&self) {
        let now = now_ms();
        self.last_failure_ms.store(now, Relaxed);
        let start = self.window_start_ms.load(Relaxed);
        let failures = if now.saturating_sub(start) > WINDOW.as_millis() as u64 {
            self.window_start_ms.store(now, Relaxed);
            self.failures.store(1, Relaxed);
            1
        } else {
            self.failures.fetch_add(1, Relaxed).saturating_add(1)
        };
        if failures >= FAILURES_TO_UNHEALTHY && self.healthy.swap(false, Relaxed) {
            tracing::warn!(
                store = self.store,
                failures,
                "hot store commands fail: not ready (fail-closed classes answer 503)"
            );
            metrics::gauge!(crate::telemetry::metrics::HOT_STORE_HEALTHY).set(0.0);
        }
    }

    /// Healthy again once [`WINDOW`] passed without a failure.
    fn heal_if_quiet(&self) {
        let quiet = now_ms().saturating_sub(self.last_failure_ms.load(Relaxed));
        if quiet > WINDOW.as_millis() as u64 && !self.healthy.swap(true, Relaxed) {
            tracing::info!(store = self.store, "hot store answers again: ready");
            metrics::gauge!(crate::telemetry::metrics::HOT_STORE_HEALTHY).set(1.0);
        }
    }

    /// False from [`FAILURES_TO_UNHEALTHY`] failures within [`WINDOW`] until a [`WINDOW`]
    /// passes without one.
    pub fn healthy(&self) -> bool {
        if !self.healthy.load(Relaxed) {
            self.heal_if_quiet();
        }
        self.healthy.load(Relaxed)
    }

    /// The store's kind, as logs and `/readyz` name it.
    pub fn store(&self) -> &'static str {
        self.store
    }

    /// Failures in the current window.
    pub fn failures(&self) -> u32 {
        self.failures.load(Relaxed)
    }

    /// Records `result`'s outcome and returns it.
    pub fn record<T, E>(&self, result: Result<T, E>) -> Result<T, E> {
        match &result {
            Ok(_) => self.answered(),
            Err(_) => self.failed(),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_failures_in_a_window_make_it_unhealthy_whatever_answered_between() {
        let health = Health::new("hot");
        health.failed();
        health.answered();
        health.failed();
        health.answered();
        assert!(health.healthy(), "two failures are noise");
        health.failed();
        assert!(
            !health.healthy(),
            "three in a second, answers between them or not"
        );
        health.answered();
        assert!(!health.healthy(), "an answer right after does not heal it");
        std::thread::sleep(WINDOW + Duration::from_millis(50));
        assert!(health.healthy(), "a quiet window heals it");
    }
}
