//! The in-process hot store (embedded mode): buckets and multipliers for one process.
//!
//! Buckets live in 64 shards, each a `std::sync::Mutex` (held only for a few map operations,
//! never across `.await`). A request that touches several shards locks them in index order,
//! so multi-scope checks are atomic without deadlocks. Full buckets are swept when a shard
//! doubles in size, so memory follows the number of active keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

type Map<V> = HashMap<Box<str>, V, foldhash::fast::RandomState>;

const SHARDS: usize = 64;
const MIN_SWEEP: usize = 1024;

#[derive(Debug, Default)]
struct Shard {
    /// Bucket key → theoretical arrival time, µs of the monotonic clock.
    buckets: Map<f64>,
    sweep_at: usize,
}

#[derive(Debug)]
struct Inner {
    shards: Vec<Mutex<Shard>>,
    /// Multiplier key → (value, expiry in monotonic µs).
    multipliers: RwLock<Map<(f64, Option<u64>)>>,
}

/// In-process buckets and multipliers (cheap to clone; clones share state).
#[derive(Debug, Clone)]
pub struct MemoryHot {
    inner: Arc<Inner>,
}

impl Default for MemoryHot {
    fn default() -> Self {
        Self::new()
    }
}

fn shard_of(key: &str) -> usize {
    use std::hash::BuildHasher;
    static SEED: std::sync::LazyLock<foldhash::fast::FixedState> =
        std::sync::LazyLock::new(|| foldhash::fast::FixedState::with_seed(0x9e37_79b9_7f4a_7c15));
    (SEED.hash_one(key) as usize) % SHARDS
}

impl MemoryHot {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                shards: (0..SHARDS)
                    .map(|_| {
                        Mutex::new(Shard {
                            buckets: Map::default(),
                            sweep_at: MIN_SWEEP,
                        })
                    })
                    .collect(),
                multipliers: RwLock::new(Map::default()),
            }),
        }
    }

    /// Reads the stored states of `keys`, lets `decide` compute new ones, and writes them,
    /// all under the keys' shard locks (atomic for this process).
    ///
    /// `decide` returns its result and, per key, `Some(tat)` to store or `None` to keep.
    pub fn update_buckets<R>(
        &self,
        keys: &[String],
        now_us: f64,
        decide: impl FnOnce(&[Option<f64>]) -> (R, Vec<Option<f64>>),
    ) -> R {
        let shard_ids: Vec<usize> = keys.iter().map(|k| shard_of(k)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> = order
            .iter()
            .map(|&i| {
                self.inner.shards[i]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
            })
            .collect();
        let slot = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let states: Vec<Option<f64>> = keys
            .iter()
            .zip(&shard_ids)
            .map(|(key, &shard)| {
                guards[slot(shard)]
                    .buckets
                    .get(key.as_str())
                    .copied()
                    .filter(|&tat| tat > now_us)
            })
            .collect();
        let (result, writes) = decide(&states);
        for ((key, &shard), write) in keys.iter().zip(&shard_ids).zip(writes) {
            if let Some(tat) = write {
                let guard = &mut guards[slot(shard)];
                guard.buckets.insert(key.as_str().into(), tat);
                if guard.buckets.len() >= guard.sweep_at {
                    guard.buckets.retain(|_, tat| *tat > now_us);
                    guard.sweep_at = (guard.buckets.len() * 2).max(MIN_SWEEP);
                }
            }
        }
        result
    }

    /// Number of stored buckets (full ones may linger until their shard is swept).
    pub fn bucket_count(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .buckets
                    .len()
            })
            .sum()
    }

    /// Sets a multiplier, expiring `ttl_us` after `now_us` (None: until replaced).
    pub fn set_multiplier(&self, key: &str, value: f64, now_us: u64, ttl_us: Option<u64>) {
        let mut map = self
            .inner
            .multipliers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if map.len() >= MIN_SWEEP && map.len().is_power_of_two() {
            map.retain(|_, (_, expires)| expires.is_none_or(|e| e > now_us));
        }
        map.insert(key.into(), (value, ttl_us.map(|ttl| now_us + ttl)));
    }

    /// Removes a multiplier (back to 1).
    pub fn clear_multiplier(&self, key: &str) {
        let mut map = self
            .inner
            .multipliers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        map.remove(key);
    }

    /// A multiplier and the µs until it expires (None: no expiry), if set and not expired.
    pub fn multiplier(&self, key: &str, now_us: u64) -> Option<(f64, Option<u64>)> {
        let map = self
            .inner
            .multipliers
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let &(value, expires) = map.get(key)?;
        match expires {
            Some(at) if at <= now_us => None,
            Some(at) => Some((value, Some(at - now_us))),
            None => Some((value, None)),
        }
    }
}
