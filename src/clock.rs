//! Time, passed in: domain code never reads the wall clock itself, nor makes ids on its own.
//!
//! [`Clock`] gives wall time (for durable timestamps), a monotonic reading (for in-process
//! token buckets) and new ids (ULIDs whose time part is the clock's, so ids sort by when they
//! were made by that clock). [`SystemClock`] is the real one; [`ManualClock`] is moved by
//! tests and benches.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall and monotonic time, and of ids.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Wall time as milliseconds since the Unix epoch (durable timestamps, `reset` headers).
    fn now_ms(&self) -> i64;
    /// Monotonic time since an arbitrary origin, in microseconds; never goes backwards.
    fn monotonic_us(&self) -> u64;
    /// A new id: a ULID made at [`Clock::now_ms`], after every id this clock made before
    /// (ids within one millisecond count up), so `ORDER BY id` is the order of creation.
    fn new_id(&self) -> ulid::Ulid;
}

/// Ids that count up within a millisecond ([`Clock::new_id`]).
#[derive(Default)]
struct Ids(std::sync::Mutex<ulid::Generator>);

impl std::fmt::Debug for Ids {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ids")
    }
}

impl Ids {
    fn at(&self, ms: i64) -> ulid::Ulid {
        let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        let mut generator = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Overflow of the random part within one millisecond (2^80 ids): a fresh random id.
        generator
            .generate_from_datetime(at)
            .unwrap_or_else(|_| ulid::Ulid::from_datetime(at))
    }
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
    ids: Ids,
}

impl SystemClock {
    /// A clock whose monotonic origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            ids: Ids::default(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }

    fn monotonic_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn new_id(&self) -> ulid::Ulid {
        self.ids.at(self.now_ms())
    }
}

/// A clock that only moves when told to; wall and monotonic time move together.
#[derive(Debug, Clone)]
pub struct ManualClock {
    wall_start_ms: i64,
    elapsed_us: Arc<AtomicU64>,
    ids: Arc<Ids>,
}

impl ManualClock {
    /// A clock standing at `wall_ms` (Unix milliseconds).
    pub fn new(wall_ms: i64) -> Self {
        Self {
            wall_start_ms: wall_ms,
            elapsed_us: Arc::new(AtomicU64::new(0)),
            ids: Arc::new(Ids::default()),
        }
    }

    /// Moves both readings forward.
    pub fn advance(&self, by: Duration) {
        let us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.elapsed_us.fetch_add(us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        let elapsed_ms = self.elapsed_us.load(Ordering::SeqCst) / 1000;
        self.wall_start_ms + i64::try_from(elapsed_ms).unwrap_or(i64::MAX)
    }

    fn monotonic_us(&self) -> u64 {
        self.elapsed_us.load(Ordering::SeqCst)
    }

    fn new_id(&self) -> ulid::Ulid {
        self.ids.at(self.now_ms())
    }
}

/// Formats Unix milliseconds as RFC 3339 with millisecond precision (`2026-12-02T14:06:44.123Z`).
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        assert_eq!(clock.monotonic_us(), 0);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now_ms(), 2_500);
        assert_eq!(clock.monotonic_us(), 1_500_000);
    }

    #[test]
    fn ids_count_up_and_carry_the_clocks_time() {
        let clock = ManualClock::new(1_800_000_000_000);
        let ids: Vec<ulid::Ulid> = (0..100).map(|_| clock.new_id()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "in creation order");
        assert_eq!(ids[0].timestamp_ms(), 1_800_000_000_000);
    }

    #[test]
    fn rfc3339_is_utc_with_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
