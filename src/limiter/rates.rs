//! Decisions per class and minute over the last day, in this process (the console's chart).
//!
//! One relaxed atomic add per decision into a ring of 1,440 minute slots per class; a slot
//! is reset when a new minute first lands in it.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Minutes kept (one day).
pub const MINUTES: usize = 1440;

#[derive(Debug, Default)]
struct Slot {
    /// The minute (Unix ms / 60,000) the counts are for.
    minute: AtomicI64,
    allowed: AtomicU64,
    limited: AtomicU64,
}

/// One class's ring.
#[derive(Debug)]
struct Ring {
    class: String,
    slots: Box<[Slot]>,
}

/// Counts of one class in one minute.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Minute {
    /// Its start, Unix ms.
    pub at_ms: i64,
    /// Requests allowed (shadow and fail-open included).
    pub allowed: u64,
    /// Requests refused.
    pub limited: u64,
}

/// The rings of every class.
#[derive(Debug)]
pub struct Rates {
    rings: Vec<Ring>,
    /// Each class's ring, by name: one hash per decision, however many classes there are.
    by_class: std::collections::HashMap<Box<str>, usize, foldhash::fast::RandomState>,
}

impl Rates {
    /// Rings for these classes.
    pub fn new<'a>(classes: impl IntoIterator<Item = &'a str>) -> Self {
        let rings: Vec<Ring> = classes
            .into_iter()
            .map(|class| Ring {
                class: class.to_owned(),
                slots: (0..MINUTES).map(|_| Slot::default()).collect(),
            })
            .collect();
        let by_class = rings
            .iter()
            .enumerate()
            .map(|(i, ring)| (ring.class.as_str().into(), i))
            .collect();
        Self { rings, by_class }
    }

    fn ring(&self, class: &str) -> Option<&Ring> {
        self.by_class.get(class).map(|&i| &self.rings[i])
    }

    /// Counts one decision of `class` at `now_ms`.
    pub fn record(&self, class: &str, now_ms: i64, allowed: bool) {
        let Some(ring) = self.ring(class) else {
            return;
        };
        let minute = now_ms.div_euclid(60_000);
        let slot = &ring.slots[minute.rem_euclid(MINUTES as i64) as usize];
        let seen = slot.minute.load(Ordering::Relaxed);
        if seen != minute
            && slot
                .minute
                .compare_exchange(seen, minute, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            // The first decision of a new minute in this slot: the day-old counts go. A
            // decision counted by another thread between the exchange and these stores is
            // lost (the chart is a rate, not a ledger).
            slot.allowed.store(0, Ordering::Relaxed);
            slot.limited.store(0, Ordering::Relaxed);
        }
        let counter = if allowed {
            &slot.allowed
        } else {
            &slot.limited
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The classes counted.
    pub fn classes(&self) -> impl Iterator<Item = &str> {
        self.rings.iter().map(|r| r.class.as_str())
    }

    /// `class`'s last `minutes` minutes up to `now_ms`, oldest first (minutes without a
    /// decision at zero); `None` for a class not counted.
    pub fn series(&self, class: &str, now_ms: i64, minutes: usize) -> Option<Vec<Minute>> {
        let ring = self.ring(class)?;
        let now = now_ms.div_euclid(60_000);
        let minutes = minutes.min(MINUTES) as i64;
        Some(
            (now - minutes + 1..=now)
                .map(|minute| {
                    let slot = &ring.slots[minute.rem_euclid(MINUTES as i64) as usize];
                    let current = slot.minute.load(Ordering::Acquire) == minute;
                    let read = |c: &AtomicU64| {
                        if current {
                            c.load(Ordering::Relaxed)
                        } else {
                            0
                        }
                    };
                    Minute {
                        at_ms: minute * 60_000,
                        allowed: read(&slot.allowed),
                        limited: read(&slot.limited),
                    }
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_minute_and_a_day_old_slot_starts_over() {
        let rates = Rates::new(["auth", "api"]);
        let t0: i64 = 30_000_000 * 60_000;
        rates.record("auth", t0, true);
        rates.record("auth", t0 + 59_999, false);
        rates.record("auth", t0 + 60_000, false);
        rates.record("unknown", t0, false);
        let series = rates.series("auth", t0 + 60_000, 3).unwrap();
        assert_eq!(
            series
                .iter()
                .map(|m| (m.at_ms - t0, m.allowed, m.limited))
                .collect::<Vec<_>>(),
            [(-60_000, 0, 0), (0, 1, 1), (60_000, 0, 1)]
        );
        assert_eq!(rates.series("api", t0, 1).unwrap()[0].allowed, 0);
        assert!(rates.series("unknown", t0, 1).is_none());
        // A day later the same slot holds the new minute only.
        let day = MINUTES as i64 * 60_000;
        rates.record("auth", t0 + day, true);
        let later = rates.series("auth", t0 + day, 1).unwrap();
        assert_eq!((later[0].allowed, later[0].limited), (1, 0));
        // The minute after t0 is still within the day.
        let whole = rates.series("auth", t0 + day, MINUTES).unwrap();
        assert_eq!((whole[0].at_ms - t0, whole[0].limited), (60_000, 1));
    }
}
