//! Per-key request-rate baselines and the anomaly rule, in a table of fixed size.
//!
//! Each key (`ip:…`, `user:…`, `device:…`) keeps an exponentially weighted moving average of
//! its requests per minute and the count of the current minute. A key whose current minute
//! reaches `ratio ×` its baseline (or its kind's, while it is new) is anomalous, once per
//! cooling period.
//!
//! Memory is fixed when the table is made: keys live in 4-way sets (32 bytes a slot), and a
//! new key takes the slot of the weakest key of its set (lowest baseline, then oldest). An
//! attacker spraying random keys therefore evicts other low-rate keys, never grows the table,
//! and cannot push out a heavy key's history. Written by hand: the bounded cache crates evict
//! by recency or frequency and update values only by replacement, while this needs in-place
//! updates under one shard lock and eviction by baseline.

use std::sync::{Mutex, PoisonError};

use crate::config::AnomalySettings;
use crate::model::SubjectKind;

const WAYS: usize = 4;
/// Key-minutes a kind baseline needs before it judges new keys.
const KIND_MIN_SAMPLES: u64 = 100;
const SHARDS: usize = 16;

/// One tracked key.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// Hash of the key text; 0 = empty.
    hash: u64,
    /// Minute (Unix ms ÷ 60000) of `count`.
    minute: u32,
    /// Requests in `minute`.
    count: u32,
    /// Minutes folded into `ewma`.
    seen: u32,
    /// No new anomaly before this minute.
    cooling_until: u32,
    /// Requests per minute, exponentially weighted.
    ewma: f64,
}

#[derive(Debug)]
struct Shard {
    sets: Vec<[Slot; WAYS]>,
    /// Keys tracked (for the memory bound test and metrics).
    used: usize,
}

/// What made a key anomalous.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Anomaly {
    /// Requests in the current minute.
    pub count: u32,
    /// The baseline it was judged against, per minute.
    pub baseline: f64,
    /// True when the key was new and judged against its kind's baseline.
    pub class_baseline: bool,
}

/// Baselines of one instance.
#[derive(Debug)]
pub struct Baselines {
    shards: Vec<Mutex<Shard>>,
    /// Mean per-minute count of established keys, per kind (ip, user, device), and how many
    /// key-minutes it has seen: a kind baseline judges new keys only once it has seen
    /// [`KIND_MIN_SAMPLES`] (so a fresh instance does not flag every busy key).
    kinds: Mutex<[(f64, u64); 3]>,
    alpha: f64,
    settings: AnomalySettings,
}

fn kind_index(kind: SubjectKind) -> usize {
    match kind {
        SubjectKind::User => 1,
        SubjectKind::Device => 2,
        _ => 0,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Baselines {
    /// A table for `settings.capacity` keys (rounded up to whole sets).
    pub fn new(settings: &AnomalySettings) -> Self {
        let sets_per_shard = settings.capacity.div_ceil(WAYS * SHARDS).max(1);
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        sets: vec![[Slot::default(); WAYS]; sets_per_shard],
                        used: 0,
                    })
                })
                .collect(),
            kinds: Mutex::new([(0.0, 0); 3]),
            alpha: 1.0 - 0.5_f64.powf(1.0 / settings.half_life_minutes),
            settings: settings.clone(),
        }
    }

    /// Most keys the table can hold.
    pub fn capacity(&self) -> usize {
        self.shards.len() * lock(&self.shards[0]).sets.len() * WAYS
    }

    /// Keys currently tracked.
    pub fn tracked(&self) -> usize {
        self.shards.iter().map(|s| lock(s).used).sum()
    }

    /// Bytes the table holds (fixed at creation).
    pub fn bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<Slot>()
    }

    /// Folds a finished minute's count into a slot's average, then `idle` empty minutes.
    fn fold(&self, slot: &mut Slot, idle: u32, kind: usize) {
        let count = f64::from(slot.count);
        // A warm start: the first minutes are a plain mean, then the EWMA takes over.
        let weight = (1.0 / f64::from(slot.seen + 1)).max(self.alpha);
        slot.ewma += weight * (count - slot.ewma);
        slot.seen = slot.seen.saturating_add(1);
        if slot.seen > self.settings.warmup_minutes {
            let mut kinds = lock(&self.kinds);
            let (mean, samples) = &mut kinds[kind];
            *samples += 1;
            // A plain mean at first, then a slow average of established keys' baselines.
            let weight = (1.0 / *samples as f64).max(0.01);
            *mean += weight * (slot.ewma - *mean);
        }
        if idle > 0 {
            slot.ewma *= (1.0 - self.alpha).powi(i32::try_from(idle.min(10_000)).unwrap_or(0));
            slot.seen = slot.seen.saturating_add(idle);
        }
    }

    /// Counts `n` requests of the key with `hash` (of kind `kind`) in `minute`; returns the
    /// anomaly if this made the key anomalous (once per cooling period).
    /// Brings the key's count of `minute` up to `total` (the count over every instance) and
    /// judges it, as [`Baselines::observe`] does with what this instance had not counted.
    pub fn observe_total(
        &self,
        hash: u64,
        kind: SubjectKind,
        minute: u32,
        total: u32,
    ) -> Option<Anomaly> {
        // A minute this instance has folded already keeps what it folded (adding the rest
        // there would count this instance's share twice into the average).
        let current = self.count_in(hash, minute)?;
        match total.saturating_sub(current) {
            0 => None,
            more => self.observe(hash, kind, minute, more),
        }
    }

    /// The key's count in `minute` on this instance: 0 when untracked or at an earlier
    /// minute, None when the key is past `minute`.
    fn count_in(&self, hash: u64, minute: u32) -> Option<u32> {
        let hash = hash.max(1);
        let shard = lock(&self.shards[(hash % SHARDS as u64) as usize]);
        let set_index = ((hash / SHARDS as u64) % shard.sets.len() as u64) as usize;
        match shard.sets[set_index].iter().find(|s| s.hash == hash) {
            Some(slot) if slot.minute > minute => None,
            Some(slot) if slot.minute == minute => Some(slot.count),
            _ => Some(0),
        }
    }

    pub fn observe(&self, hash: u64, kind: SubjectKind, minute: u32, n: u32) -> Option<Anomaly> {
        let hash = hash.max(1);
        let kind = kind_index(kind);
        let shard_index = (hash % SHARDS as u64) as usize;
        let mut shard = lock(&self.shards[shard_index]);
        let set_index = ((hash / SHARDS as u64) % shard.sets.len() as u64) as usize;
        let found = shard.sets[set_index].iter().position(|s| s.hash == hash);
        let way = match found {
            Some(way) => way,
            None => {
                let set = &shard.sets[set_index];
                let (way, slot) = set
                    .iter()
                    .enumerate()
                    .min_by(|(_, a), (_, b)| {
                        let empty = |s: &Slot| s.hash == 0;
                        empty(b)
                            .cmp(&empty(a))
                            .then(a.ewma.total_cmp(&b.ewma))
                            .then(a.minute.cmp(&b.minute))
                    })
                    .map(|(i, s)| (i, *s))
                    .unwrap_or((0, Slot::default()));
                if slot.hash == 0 {
                    shard.used += 1;
                }
                shard.sets[set_index][way] = Slot {
                    hash,
                    minute,
                    ..Slot::default()
                };
                way
            }
        };
        let mut slot = shard.sets[set_index][way];
        if minute > slot.minute {
            let idle = minute - slot.minute - 1;
            self.fold(&mut slot, idle, kind);
            slot.minute = minute;
            slot.count = 0;
        }
        if minute < slot.minute {
            // A late event (an older, folded minute, e.g. from a gateway batching slowly):
            // it adds to the average as if it had been counted then, and never to the
            // current minute, so out-of-order telemetry cannot look like a burst.
            slot.ewma += self.alpha.max(1.0 / f64::from(slot.seen.max(1))) * f64::from(n);
            shard.sets[set_index][way] = slot;
            return None;
        }
        slot.count = slot.count.saturating_add(n);
        let own = slot.seen >= self.settings.warmup_minutes;
        let baseline = if own {
            Some(slot.ewma)
        } else {
            let (mean, samples) = lock(&self.kinds)[kind];
            (samples >= KIND_MIN_SAMPLES).then_some(mean)
        };
        // A new key of a kind without an established baseline is not judged yet.
        let Some(baseline) = baseline else {
            shard.sets[set_index][way] = slot;
            return None;
        };
        let effective = baseline.max(self.settings.min_baseline_per_min);
        let anomalous = f64::from(slot.count) >= self.settings.ratio * effective
            && minute >= slot.cooling_until;
        if anomalous {
            let cooling_min = u32::try_from(self.settings.cooling_s.div_ceil(60)).unwrap_or(1);
            slot.cooling_until = minute.saturating_add(cooling_min.max(1));
        }
        shard.sets[set_index][way] = slot;
        anomalous.then_some(Anomaly {
            count: slot.count,
            baseline: effective,
            class_baseline: !own,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AnomalySettings {
        AnomalySettings {
            capacity: 1024,
            ..AnomalySettings::default()
        }
    }

    /// `per_minute` requests a minute for `minutes` minutes from `start`; anomalies seen.
    fn steady(b: &Baselines, hash: u64, start: u32, minutes: u32, per_minute: u32) -> usize {
        let mut anomalies = 0;
        for minute in start..start + minutes {
            for _ in 0..per_minute {
                anomalies += usize::from(b.observe(hash, SubjectKind::Device, minute, 1).is_some());
            }
        }
        anomalies
    }

    #[test]
    fn a_jump_to_100x_the_baseline_is_one_anomaly_per_cooling_period() {
        let b = Baselines::new(&settings());
        assert_eq!(steady(&b, 7, 0, 60, 10), 0);
        let mut anomalies = Vec::new();
        for _ in 0..3000 {
            anomalies.extend(b.observe(7, SubjectKind::Device, 60, 1));
        }
        assert_eq!(anomalies.len(), 1, "one anomaly, not one per request");
        let anomaly = anomalies[0];
        assert_eq!(anomaly.count, 1000, "fires when the count reaches 100x");
        assert!((anomaly.baseline - 10.0).abs() < 0.5, "{anomaly:?}");
        assert!(!anomaly.class_baseline);
        // Still high in the next minute, but within the cooling period.
        assert!(
            (0..3000)
                .filter_map(|_| b.observe(7, SubjectKind::Device, 61, 1))
                .next()
                .is_none()
        );
    }

    #[test]
    fn merged_totals_raise_the_current_minute_and_leave_folded_ones_alone() {
        let b = Baselines::new(&settings());
        // This instance saw half of a key's steady 10/min.
        assert_eq!(steady(&b, 11, 0, 60, 5), 0);
        // The merged total of a past minute changes nothing (no double counting).
        assert!(
            b.observe_total(11, SubjectKind::Device, 30, 10_000)
                .is_none()
        );
        // The current minute: 400 here (80x, below the ratio), 1000 over every instance:
        // one anomaly, on the total.
        for _ in 0..400 {
            assert!(b.observe(11, SubjectKind::Device, 60, 1).is_none());
        }
        let anomaly = b
            .observe_total(11, SubjectKind::Device, 60, 1000)
            .expect("the merged count is 200x this instance's baseline");
        assert_eq!(anomaly.count, 1000);
        // A total no larger than what is counted here adds nothing.
        assert!(b.observe_total(11, SubjectKind::Device, 60, 400).is_none());
    }

    #[test]
    fn a_steady_heavy_key_is_never_anomalous() {
        let b = Baselines::new(&settings());
        assert_eq!(steady(&b, 9, 0, 120, 2000), 0);
    }

    #[test]
    fn a_trivial_baseline_is_judged_against_the_minimum() {
        let b = Baselines::new(&settings());
        // One request every few minutes: a baseline far below 1 per minute.
        for minute in (0..60).step_by(6) {
            b.observe(3, SubjectKind::User, minute, 1);
        }
        // 50 requests is 100x of 0.5/min but not of the 1/min minimum.
        let hits = (0..50)
            .filter_map(|_| b.observe(3, SubjectKind::User, 61, 1))
            .count();
        assert_eq!(hits, 0);
        let hits = (0..60)
            .filter_map(|_| b.observe(3, SubjectKind::User, 61, 1))
            .count();
        assert_eq!(hits, 1, "110 requests pass 100 x 1/min");
    }

    #[test]
    fn a_new_key_is_judged_against_its_kinds_baseline() {
        let b = Baselines::new(&settings());
        for key in 100..110 {
            steady(&b, key, 0, 30, 20);
        }
        // A brand-new device: 20/min is its kind's baseline, so 2000 in its first minute is
        // 100x of it (the kind has seen 10 keys x 20 minutes past their warm-up).
        let first = (0..3000)
            .filter_map(|_| b.observe(555, SubjectKind::Device, 30, 1))
            .next()
            .expect("anomalous");
        assert!(first.class_baseline);
        assert!((1900..=2000).contains(&first.count), "{first:?}");
    }

    #[test]
    fn without_an_established_kind_baseline_new_keys_are_not_judged() {
        let b = Baselines::new(&settings());
        // A fresh instance: the first busy key is no anomaly just for being busy.
        assert_eq!(steady(&b, 1, 0, 3, 5000), 0);
    }

    #[test]
    fn late_events_for_past_minutes_never_count_as_a_burst() {
        let b = Baselines::new(&settings());
        assert_eq!(steady(&b, 5, 0, 20, 10), 0);
        // A slow gateway delivers last quarter-hour's traffic now, minute by minute.
        for minute in 5..20 {
            for _ in 0..300 {
                assert!(b.observe(5, SubjectKind::Ip, minute, 1).is_none());
            }
        }
    }

    #[test]
    fn a_flood_of_random_keys_never_grows_the_table() {
        let b = Baselines::new(&settings());
        let capacity = b.capacity();
        let bytes = b.bytes();
        steady(&b, 42, 0, 30, 100);
        for key in 0..1_000_000u64 {
            b.observe(
                key.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                SubjectKind::Ip,
                30,
                1,
            );
        }
        assert!(b.tracked() <= capacity, "{} > {capacity}", b.tracked());
        assert_eq!(b.bytes(), bytes);
        // The heavy key kept its history: no anomaly at its usual rate.
        assert_eq!(steady(&b, 42, 31, 1, 100), 0);
    }
}
