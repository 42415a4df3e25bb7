//! The in-process hot store (embedded mode): buckets and multipliers for one process.
//!
//! Buckets live in 64 shards, each a `std::sync::Mutex` (held only for a few map operations,
//! never across `.await`). A request that touches several shards locks them in index order,
//! so multi-scope checks are atomic without deadlocks. Full buckets are swept when a shard
//! doubles in size, so memory follows the number of active keys.
//!
//! A bucket is found by a 64-bit hash of its key (`foldhash` with a random per-process
//! seed) rather than by the string: the entry is 16 bytes inline (a lookup touches one cache
//! line of a table that is a third smaller than with a 128-bit hash, which is what a check
//! costs on 100k keys: the load of the entry), and nothing is allocated per check. Two keys
//! share a bucket only on a 64-bit collision: about n²/2⁶⁵ for n live keys (3·10⁻⁸ for a
//! million), and the random seed keeps callers from steering ids towards one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use smallvec::SmallVec;

use super::window::{WindowAction, WindowStep, WindowValue};

type Map<V> = HashMap<Box<str>, V, foldhash::fast::RandomState>;
type BucketMap = HashMap<u64, f64, PreHashed>;

/// The map's hasher for keys that already are random hashes: the table uses the key as is
/// (its low bits pick the slot, its top 7 the tag; bits 32..38 pick the shard, see
/// [`MemoryHot::locate`]), instead of hashing it again.
#[derive(Debug, Clone, Copy, Default)]
struct PreHashed;

impl std::hash::BuildHasher for PreHashed {
    type Hasher = PreHashedHasher;

    fn build_hasher(&self) -> PreHashedHasher {
        PreHashedHasher(0)
    }
}

/// Keeps the last `u64` written.
#[derive(Debug, Clone, Copy, Default)]
struct PreHashedHasher(u64);

impl std::hash::Hasher for PreHashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u64` keys; fold anything else in so the hasher stays correct.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(word);
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = word;
    }
}

const SHARDS: usize = 64;

/// A bucket id's shard: bits 32..38 of the hash, which the shard's table does not use (it
/// takes the low bits for the slot and the top 7 for the tag).
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}
const MIN_SWEEP: usize = 1024;

#[derive(Debug, Default)]
struct Shard {
    /// Hash of the bucket key → theoretical arrival time, µs of the monotonic clock.
    buckets: BucketMap,
    sweep_at: usize,
}

#[derive(Debug)]
struct Inner {
    /// Sliding windows and small key/value entries (locks, known sets), with expiry in the
    /// caller's wall-clock milliseconds. std Mutex: never held across `.await`.
    windows: Mutex<Map<WindowValue>>,
    values: Mutex<HashMap<String, (String, i64)>>,
    /// Seed of the bucket keys' hash.
    seed: foldhash::fast::RandomState,
    shards: Vec<Mutex<Shard>>,
    /// Multiplier key → (value, expiry in monotonic µs).
    multipliers: RwLock<Map<(f64, Option<u64>)>>,
    /// How many multipliers are stored (written under the map's write lock): none means a
    /// check need not build or look up multiplier keys.
    multiplier_count: std::sync::atomic::AtomicUsize,
}

/// Drops expired values each time the map reaches a power of two (amortised O(1)), so it
/// follows the live entries (challenges, markers), not everything ever written.
fn sweep_values(values: &mut HashMap<String, (String, i64)>, now_ms: i64) {
    if values.len() >= MIN_SWEEP && values.len().is_power_of_two() {
        values.retain(|_, (_, expires)| *expires > now_ms);
    }
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

impl MemoryHot {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                windows: Mutex::new(Map::default()),
                values: Mutex::new(HashMap::new()),
                seed: Default::default(),
                shards: (0..SHARDS)
                    .map(|_| {
                        Mutex::new(Shard {
                            buckets: BucketMap::default(),
                            sweep_at: MIN_SWEEP,
                        })
                    })
                    .collect(),
                multipliers: RwLock::new(Map::default()),
                multiplier_count: std::sync::atomic::AtomicUsize::new(0),
            }),
        }
    }

    /// Reads the stored states of `keys`, lets `compute` make new ones, and writes them,
    /// all under the keys' shard locks (atomic for this process).
    ///
    /// `compute` gets the states (None: full or absent) and fills `writes` with `Some(tat)`
    /// for each key to store.
    pub fn update_buckets<R>(
        &self,
        keys: &[&str],
        now_us: f64,
        compute: impl FnOnce(&[Option<f64>], &mut [Option<f64>]) -> R,
    ) -> R {
        let ids: SmallVec<[u64; 8]> = keys.iter().map(|k| self.bucket_id(k, "", "")).collect();
        self.update_buckets_by_id(&ids, now_us, compute)
    }

    /// The id of the bucket named by the three parts (a subject, a budget, a variant), the
    /// same as [`MemoryHot::update_buckets`] gives the key `subject` alone: the parts are
    /// hashed in turn with the store's random seed, no key text is built.
    pub fn bucket_id(&self, subject: &str, budget: &str, variant: &str) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = self.inner.seed.build_hasher();
        hasher.write(subject.as_bytes());
        if !budget.is_empty() || !variant.is_empty() {
            // Separators no part contains (ids and names have no control characters).
            hasher.write_u8(0);
            hasher.write(budget.as_bytes());
            hasher.write_u8(0);
            hasher.write(variant.as_bytes());
        }
        hasher.finish()
    }

    /// [`MemoryHot::update_buckets`] by [`MemoryHot::bucket_id`]s.
    pub fn update_buckets_by_id<R>(
        &self,
        ids: &[u64],
        now_us: f64,
        compute: impl FnOnce(&[Option<f64>], &mut [Option<f64>]) -> R,
    ) -> R {
        if let [id] = ids {
            return self.update_bucket(*id, now_us, compute);
        }
        let (hashes, shard_ids): (SmallVec<[u64; 8]>, SmallVec<[usize; 8]>) =
            ids.iter().map(|&id| (id, shard_of(id))).unzip();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 8]> = order
            .iter()
            .map(|&i| {
                self.inner.shards[i]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
            })
            .collect();
        let slot = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let states: SmallVec<[Option<f64>; 8]> = hashes
            .iter()
            .zip(&shard_ids)
            .map(|(hash, &shard)| {
                guards[slot(shard)]
                    .buckets
                    .get(hash)
                    .copied()
                    .filter(|&tat| tat > now_us)
            })
            .collect();
        let mut writes: SmallVec<[Option<f64>; 8]> = smallvec::smallvec![None; ids.len()];
        let result = compute(&states, &mut writes);
        for ((hash, &shard), write) in hashes.iter().zip(&shard_ids).zip(writes) {
            let Some(tat) = write else { continue };
            let guard = &mut guards[slot(shard)];
            if guard.buckets.insert(*hash, tat).is_some() {
                continue;
            }
            if guard.buckets.len() >= guard.sweep_at {
                guard.buckets.retain(|_, tat| *tat > now_us);
                guard.sweep_at = (guard.buckets.len() * 2).max(MIN_SWEEP);
            }
        }
        result
    }

    /// [`MemoryHot::update_buckets`] for one key: one shard lock, one map probe.
    fn update_bucket<R>(
        &self,
        hash: u64,
        now_us: f64,
        compute: impl FnOnce(&[Option<f64>], &mut [Option<f64>]) -> R,
    ) -> R {
        use std::collections::hash_map::Entry;
        let shard = shard_of(hash);
        let mut guard = self.inner.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut writes = [None];
        match guard.buckets.entry(hash) {
            Entry::Occupied(mut entry) => {
                let state = Some(*entry.get()).filter(|&tat| tat > now_us);
                let result = compute(&[state], &mut writes);
                if let Some(tat) = writes[0] {
                    entry.insert(tat);
                }
                result
            }
            Entry::Vacant(entry) => {
                let result = compute(&[None], &mut writes);
                let Some(tat) = writes[0] else {
                    return result;
                };
                entry.insert(tat);
                if guard.buckets.len() >= guard.sweep_at {
                    guard.buckets.retain(|_, tat| *tat > now_us);
                    guard.sweep_at = (guard.buckets.len() * 2).max(MIN_SWEEP);
                }
                result
            }
        }
    }

    /// The twin of one call of `lua/velocity_batch.lua`: its operations in order
    /// ([`WindowValue::step`]), then each value's end of call ([`WindowValue::finish`]).
    pub fn window_steps(&self, steps: &[WindowStep], now_ms: i64) -> Vec<(u32, Option<i64>)> {
        let mut values = self
            .inner
            .windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if values.len() >= MIN_SWEEP && values.len().is_power_of_two() {
            values.retain(|_, value| {
                value.drop_expired(now_ms);
                !value.is_empty()
            });
        }
        let counts = steps
            .iter()
            .map(|step| match values.get_mut(step.key.as_str()) {
                Some(value) => value.step(step, now_ms),
                // Only a step that adds creates a value: counting an unknown subject (a
                // status query for any account name) leaves nothing behind.
                None if step.action != WindowAction::Record || step.member.is_none() => (0, None),
                None => values
                    .entry(step.key.as_str().into())
                    .or_default()
                    .step(step, now_ms),
            })
            .collect();
        for step in steps {
            if let Some(value) = values.get_mut(step.key.as_str()) {
                value.finish(now_ms);
            }
        }
        counts
    }

    /// Deletes window values (every window of each).
    pub fn window_clear(&self, keys: &[String]) {
        let mut values = self
            .inner
            .windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for key in keys {
            values.remove(key.as_str());
        }
    }

    /// `SET key value NX PX ttl`: true if it was set.
    pub fn value_set_nx(&self, key: &str, value: &str, now_ms: i64, ttl_ms: i64) -> bool {
        let mut values = self
            .inner
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if values
            .get(key)
            .is_some_and(|(_, expires)| *expires > now_ms)
        {
            return false;
        }
        sweep_values(&mut values, now_ms);
        values.insert(key.to_owned(), (value.to_owned(), now_ms + ttl_ms));
        true
    }

    /// `GET key` with its remaining TTL in ms.
    pub fn value_get(&self, key: &str, now_ms: i64) -> Option<(String, i64)> {
        let values = self
            .inner
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        values
            .get(key)
            .filter(|(_, expires)| *expires > now_ms)
            .map(|(value, expires)| (value.clone(), expires - now_ms))
    }

    /// Reads a live value and, under the same lock, replaces it with what `compute` returns
    /// (`Some((value, ttl_ms))`) or leaves it (None): a read-modify-write as one step.
    pub fn value_update<R>(
        &self,
        key: &str,
        now_ms: i64,
        compute: impl FnOnce(Option<&str>) -> (Option<(String, i64)>, R),
    ) -> R {
        let mut values = self
            .inner
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = values
            .get(key)
            .filter(|(_, expires)| *expires > now_ms)
            .map(|(value, _)| value.as_str());
        let (write, result) = compute(current);
        if let Some((value, ttl_ms)) = write {
            sweep_values(&mut values, now_ms);
            values.insert(key.to_owned(), (value, now_ms + ttl_ms));
        }
        result
    }

    /// `DEL key`.
    pub fn value_delete(&self, key: &str) {
        self.inner
            .values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
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
        self.inner
            .multiplier_count
            .store(map.len(), std::sync::atomic::Ordering::Release);
    }

    /// Whether any multiplier is stored (expired ones included until swept).
    pub fn has_multipliers(&self) -> bool {
        self.inner
            .multiplier_count
            .load(std::sync::atomic::Ordering::Acquire)
            > 0
    }

    /// Removes a multiplier (back to 1).
    pub fn clear_multiplier(&self, key: &str) {
        let mut map = self
            .inner
            .multipliers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        map.remove(key);
        self.inner
            .multiplier_count
            .store(map.len(), std::sync::atomic::Ordering::Release);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn step(key: &str, action: WindowAction, member: Option<u64>) -> WindowStep {
        WindowStep {
            key: key.to_owned(),
            window: "f".to_owned(),
            member,
            score: 1_000_000,
            window_ms: 600_000,
            cap: 1000,
            gap: true,
            action,
        }
    }

    /// A status query counts the windows of whatever account it names: counting, membership
    /// checks and deletes of unknown subjects must not leave values (or windows) behind.
    #[test]
    fn only_an_addition_creates_a_value_or_a_window() {
        let memory = MemoryHot::new();
        let now = 1_000_000;
        for i in 0..100 {
            let key = format!("unknown-{i}");
            assert_eq!(
                memory.window_steps(
                    std::slice::from_ref(&step(&key, WindowAction::Record, None)),
                    now
                )[0],
                (0, None)
            );
            assert_eq!(
                memory.window_steps(
                    std::slice::from_ref(&step(&key, WindowAction::Contains, Some(7))),
                    now
                )[0],
                (0, None)
            );
            assert_eq!(
                memory.window_steps(
                    std::slice::from_ref(&step(&key, WindowAction::Delete, None)),
                    now
                )[0],
                (0, None)
            );
        }
        let values = |m: &MemoryHot| m.inner.windows.lock().unwrap().len();
        assert_eq!(values(&memory), 0);
        assert_eq!(
            memory.window_steps(
                std::slice::from_ref(&step("known", WindowAction::Record, Some(7))),
                now
            )[0],
            (1, None)
        );
        assert_eq!(values(&memory), 1);
        // Counting another window of an existing value adds no empty window to it.
        let other = WindowStep {
            window: "a".to_owned(),
            ..step("known", WindowAction::Record, None)
        };
        assert_eq!(
            memory.window_steps(std::slice::from_ref(&other), now)[0],
            (0, None)
        );
        let windows = memory.inner.windows.lock().unwrap()["known"].window_count();
        assert_eq!(windows, 1);
    }
}
