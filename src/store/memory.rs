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
const MIN_SWEEP: usize = 1024;

#[derive(Debug, Default)]
struct Shard {
    /// Hash of the bucket key → theoretical arrival time, µs of the monotonic clock.
    buckets: BucketMap,
    sweep_at: usize,
}

/// A sliding window: (score, member id) in ascending order.
///
/// A deque rather than a `BTreeSet`: entries arrive in time order nearly always (pushed at the
/// back), age out at the front, and a value read from Redis is already sorted; one buffer,
/// sized once when read, where the tree allocated nodes as it grew.
#[derive(Debug, Default)]
struct Window {
    entries: std::collections::VecDeque<(i64, u64)>,
    expires_ms: i64,
}

impl Window {
    /// Drops the oldest entries while there are more than `keep`.
    fn keep_newest(&mut self, keep: usize) {
        let extra = self.entries.len().saturating_sub(keep);
        self.entries.drain(..extra);
    }

    /// Adds an entry in order (after every smaller one), unless the member has one: a
    /// retried event keeps its first score (it neither counts twice nor stays longer).
    /// Returns whether it was added.
    fn insert(&mut self, entry: (i64, u64)) -> bool {
        if self.entries.iter().any(|(_, id)| *id == entry.1) {
            return false;
        }
        let at = self.entries.partition_point(|e| *e < entry);
        self.entries.insert(at, entry);
        true
    }

    /// The smallest difference between neighbouring scores (entries are sorted), if the
    /// window holds two or more: every entry compared with its nearest neighbours in time.
    fn smallest_gap(&self) -> Option<i64> {
        self.entries
            .iter()
            .zip(self.entries.iter().skip(1))
            .map(|(a, b)| b.0 - a.0)
            .min()
    }
}

/// A window's name (at most 17 bytes: a kind and 16 hex digits), kept inline: no allocation
/// per window read or created.
type WindowName = SmallVec<[u8; 24]>;

/// Most live windows of one kind (the first byte of their names) a window value keeps after
/// a call that created windows of that kind.
///
/// The same bound as `MAX_KIND` in `lua/velocity_batch.lua`. An account failing from many IPs
/// has a pair window per IP: without a bound, a distributed brute force would grow its value
/// (read and rewritten on every failure) with every new IP. Applied at the end of a call
/// ([`WindowValue::finish`]), once, rather than at every new window: sorting once per call
/// is cheap where a scan per new window made a script call on a hot account take 28 ms.
pub const MAX_WINDOWS_PER_KIND: usize = 128;

/// The windows of one subject's value, by name.
///
/// The in-process twin of one value of `lua/velocity_batch.lua`, and how the Redis backend
/// computes a value it read ([`WindowValue::unpack`]) and writes it back in the script's layout
/// ([`WindowValue::packed`]).
#[derive(Debug, Default)]
pub struct WindowValue {
    /// By name, in no order. A list searched in order: most values hold a handful of windows
    /// (an IP's two, an account's failures and a pair window per recent IP), where hashing
    /// each name cost more than comparing it with every other; the most a value keeps is
    /// [`MAX_WINDOWS_PER_KIND`] of each kind.
    windows: Vec<(WindowName, Window)>,
    /// A step added an entry or deleted a window: the value must be written back.
    changed: bool,
    /// Kinds (first name byte) of the windows created since the last
    /// [`WindowValue::finish`], each with the cutoff of its window.
    created: Vec<(Option<u8>, i64)>,
}

impl WindowValue {
    fn position(&self, name: &[u8]) -> Option<usize> {
        self.windows.iter().position(|(n, _)| n[..] == *name)
    }

    /// One operation, as the script does it: a window past its expiry (last addition +
    /// window) is gone; entries before `now − window` are dropped; a member in range is added
    /// (one already there keeps its score), at most `cap` kept; answers the count and, when
    /// asked, the smallest gap between neighbouring scores (1 or 0 for
    /// [`WindowAction::Contains`]; [`WindowAction::Remove`] takes the member out).
    pub fn step(&mut self, step: &WindowStep, now_ms: i64) -> (u32, Option<i64>) {
        if step.action == WindowAction::Delete {
            if let Some(at) = self.position(step.window.as_bytes()) {
                self.windows.swap_remove(at);
                self.changed = true;
            }
            return (0, None);
        }
        let cutoff = now_ms - step.window_ms;
        let adds =
            step.action == WindowAction::Record && step.member.is_some() && step.score >= cutoff;
        // Looked up before inserting: a name is allocated only for a window that gets an
        // entry (counting an absent window leaves no empty one behind). An expired window is
        // absent, as in a value read from Redis.
        let name = step.window.as_bytes();
        let found = self.position(name);
        let at = match found {
            Some(at) if self.windows[at].1.expires_ms > now_ms => at,
            _ => {
                if !adds {
                    return (0, None);
                }
                let kind = (name.first().copied(), cutoff);
                if !self.created.contains(&kind) {
                    self.created.push(kind);
                }
                // Replaces this window if it is there (expired).
                match found {
                    Some(at) => {
                        self.windows[at].1 = Window::default();
                        at
                    }
                    None => {
                        self.windows
                            .push((WindowName::from_slice(name), Window::default()));
                        self.windows.len() - 1
                    }
                }
            }
        };
        let window = &mut self.windows[at].1;
        // Oldest first: dropping what aged out costs nothing per entry kept (a window holds
        // up to 1000, and a batch can step one 500 times).
        let aged = window.entries.partition_point(|(score, _)| *score < cutoff);
        window.entries.drain(..aged);
        if step.action == WindowAction::Contains {
            let found = step
                .member
                .is_some_and(|m| window.entries.iter().any(|(_, id)| *id == m));
            return (u32::from(found), None);
        }
        if step.action == WindowAction::Remove {
            if let Some(at) = step
                .member
                .and_then(|m| window.entries.iter().position(|(_, id)| *id == m))
            {
                window.entries.remove(at);
                self.changed = true;
            }
            return (
                u32::try_from(window.entries.len()).unwrap_or(u32::MAX),
                None,
            );
        }
        // An entry older than the window would not count: not added (as in Redis).
        if let Some(member) = step.member.filter(|_| adds)
            && window.insert((step.score, member))
        {
            window.keep_newest(step.cap);
            window.expires_ms = now_ms + step.window_ms;
            self.changed = true;
        }
        let count = window.entries.len();
        let gap = if step.gap {
            window.smallest_gap()
        } else {
            None
        };
        (u32::try_from(count).unwrap_or(u32::MAX), gap)
    }

    /// The end of a call: for each kind of window the call created, the value's windows of
    /// that kind holding no entry at or after the cutoff (or expired) are dropped; then, past
    /// [`MAX_WINDOWS_PER_KIND`], the ones added to least recently (smallest expiry; among
    /// equal ones, the smallest name). `lua/velocity_batch.lua` does the same before writing.
    pub fn finish(&mut self, now_ms: i64) {
        for (kind, cutoff) in std::mem::take(&mut self.created) {
            let same_kind = |name: &[u8]| name.first().copied() == kind;
            self.windows.retain(|(name, w)| {
                !same_kind(name)
                    || (w.expires_ms > now_ms
                        && w.entries.back().is_some_and(|(s, _)| *s >= cutoff))
            });
            let count = self.windows.iter().filter(|(n, _)| same_kind(n)).count();
            if count <= MAX_WINDOWS_PER_KIND {
                continue;
            }
            let mut live: Vec<(i64, WindowName)> = self
                .windows
                .iter()
                .filter(|(name, _)| same_kind(name))
                .map(|(name, w)| (w.expires_ms, name.clone()))
                .collect();
            live.sort_unstable();
            // The first kept; every window of the kind ordered before it goes.
            let (expires, first) = &live[count - MAX_WINDOWS_PER_KIND];
            self.windows.retain(|(name, w)| {
                !same_kind(name) || (w.expires_ms, &name[..]) >= (*expires, &first[..])
            });
        }
    }

    /// True once a step added an entry or deleted a window (counting and membership checks
    /// change nothing worth writing).
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// A value read from Redis (the layout of [`WindowValue::packed`]); windows expired at
    /// `now_ms` are left out. None when the bytes are not in that layout.
    pub fn unpack(bytes: &[u8], now_ms: i64) -> Option<WindowValue> {
        fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (head, rest) = bytes.split_at_checked(n)?;
            *bytes = rest;
            Some(head)
        }
        fn double(bytes: &mut &[u8]) -> Option<i64> {
            Some(f64::from_be_bytes(take(bytes, 8)?.try_into().ok()?) as i64)
        }
        let mut rest = bytes;
        // Room for a few windows more than a fresh account has (its failures, a pair window
        // per IP and device): no regrowth for most values.
        let mut value = WindowValue {
            windows: Vec::with_capacity(8),
            ..WindowValue::default()
        };
        while !rest.is_empty() {
            let name_len = usize::from(take(&mut rest, 1)?[0]);
            let name = take(&mut rest, name_len)?;
            std::str::from_utf8(name).ok()?;
            let expires_ms = double(&mut rest)?;
            let n = u32::from_be_bytes(take(&mut rest, 4)?.try_into().ok()?) as usize;
            let entries = take(&mut rest, n.checked_mul(16)?)?;
            if expires_ms <= now_ms {
                continue;
            }
            // One more slot: a window read is usually read to be added to.
            let mut window = Window {
                expires_ms,
                entries: std::collections::VecDeque::with_capacity(n + 1),
            };
            for entry in entries.chunks_exact(16) {
                let (member, score) = entry.split_at(8);
                let member = u64::from_be_bytes(member.try_into().ok()?);
                let score = f64::from_be_bytes(score.try_into().ok()?) as i64;
                window.entries.push_back((score, member));
            }
            // Written sorted; sorted again if not, as the ordered set did on insertion.
            if !window.entries.iter().is_sorted() {
                window.entries.make_contiguous().sort_unstable();
            }
            // A name written twice (not by this version) keeps its last window, as a map would.
            match value.position(name) {
                Some(at) => value.windows[at].1 = window,
                None => value.windows.push((WindowName::from_slice(name), window)),
            }
        }
        Some(value)
    }

    /// The value in the script's layout (per window: name length, name, expiry and entry
    /// count as big-endian double and u32, then 16-byte entries: member, score as a double)
    /// and its TTL in ms; None when no window holds an entry.
    pub fn packed(&self, now_ms: i64) -> Option<(Vec<u8>, i64)> {
        let live = |window: &Window| !window.entries.is_empty() && window.expires_ms > now_ms;
        // Sized once: a value is written for every ingested event's subjects.
        let size = self
            .windows
            .iter()
            .filter(|(_, window)| live(window))
            .map(|(name, window)| 1 + name.len() + 12 + 16 * window.entries.len())
            .sum();
        let mut out = Vec::with_capacity(size);
        let mut latest = now_ms;
        for (name, window) in &self.windows {
            if !live(window) {
                continue;
            }
            let name_len = u8::try_from(name.len()).expect("window names are short");
            out.push(name_len);
            out.extend_from_slice(name);
            // Milliseconds since 1970 are exact in a double (the script's number type).
            out.extend_from_slice(&(window.expires_ms as f64).to_be_bytes());
            let n = u32::try_from(window.entries.len()).expect("windows are capped");
            out.extend_from_slice(&n.to_be_bytes());
            for (score, member) in &window.entries {
                out.extend_from_slice(&member.to_be_bytes());
                out.extend_from_slice(&(*score as f64).to_be_bytes());
            }
            latest = latest.max(window.expires_ms);
        }
        (!out.is_empty()).then_some((out, latest - now_ms))
    }
}

/// What a [`WindowStep`] does to its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowAction {
    /// Add the member (if any) and count.
    Record,
    /// Answer 1 if the member is in the window, else 0; nothing added.
    Contains,
    /// Delete the window.
    Delete,
    /// Take the member out of the window (an event counted that must not have been).
    Remove,
}

/// One operation on a window of a subject's window value (`lua/velocity_batch.lua`, and its
/// twin [`MemoryHot::window_steps`]).
#[derive(Debug, Clone)]
pub struct WindowStep {
    /// The subject's window value (Redis key).
    pub key: String,
    /// The window inside it.
    pub window: String,
    /// Member id to add or look for; None only counts.
    pub member: Option<u64>,
    /// The member's score (event time, ms).
    pub score: i64,
    /// The window's length, ms (one length for every window of a value).
    pub window_ms: i64,
    /// Most entries kept.
    pub cap: usize,
    /// Also report the gap between the two newest entries.
    pub gap: bool,
    /// What to do.
    pub action: WindowAction,
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
        if let [key] = keys {
            return self.update_bucket(key, now_us, compute);
        }
        let (hashes, shard_ids): (SmallVec<[u64; 8]>, SmallVec<[usize; 8]>) =
            keys.iter().map(|k| self.locate(k)).unzip();
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
        let mut writes: SmallVec<[Option<f64>; 8]> = smallvec::smallvec![None; keys.len()];
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

    /// A bucket key's hash and its shard: bits 32..38 of the hash, which the shard's table
    /// does not use (it takes the low bits for the slot and the top 7 for the tag).
    fn locate(&self, key: &str) -> (u64, usize) {
        use std::hash::BuildHasher;
        let hash = self.inner.seed.hash_one(key);
        (hash, (hash >> 32) as usize % SHARDS)
    }

    /// [`MemoryHot::update_buckets`] for one key: one shard lock, one map probe.
    fn update_bucket<R>(
        &self,
        key: &str,
        now_us: f64,
        compute: impl FnOnce(&[Option<f64>], &mut [Option<f64>]) -> R,
    ) -> R {
        use std::collections::hash_map::Entry;
        let (hash, shard) = self.locate(key);
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
                value.windows.retain(|(_, w)| w.expires_ms > now_ms);
                !value.windows.is_empty()
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
        let windows = memory.inner.windows.lock().unwrap()["known"].windows.len();
        assert_eq!(windows, 1);
    }
}

/// The single-Redis path reads each value, steps it here and writes it back packed; the
/// in-process store keeps the value. Random sequences (every action, expiring and aging
/// windows, caps) must answer the same either way.
#[cfg(test)]
mod round_trip {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn a_value_packed_and_read_back_steps_as_the_kept_one() {
        let memory = MemoryHot::new();
        let mut stored: std::collections::HashMap<String, Vec<u8>> = Default::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut now = 1_800_000_000_000i64;
        let keys = ["a", "b", "c"];
        let windows = ["f", "a", "i1"];
        for round in 0..3000 {
            now += rng.random_range(0..180_000);
            let batch = rng.random_range(1..8);
            let steps: Vec<WindowStep> = (0..batch)
                .map(|_| {
                    let roll = rng.random_range(0..100);
                    let key = keys[rng.random_range(0..3)];
                    let window = windows[rng.random_range(0..3)];
                    let window_ms = if key == "c" { 90 * 86_400_000 } else { 600_000 };
                    WindowStep {
                        key: key.to_owned(),
                        window: window.to_owned(),
                        member: (roll % 10 != 0).then(|| rng.random_range(1..12u64)),
                        score: now - rng.random_range(-60_000..(window_ms.min(900_000))),
                        window_ms,
                        cap: match window {
                            "f" => 3,
                            "a" => 5,
                            _ => 1000,
                        },
                        gap: rng.random_bool(0.5),
                        action: match roll {
                            0..10 => WindowAction::Delete,
                            10..22 => WindowAction::Contains,
                            22..32 => WindowAction::Remove,
                            _ => WindowAction::Record,
                        },
                    }
                })
                .collect();
            let in_memory = memory.window_steps(&steps, now);
            let mut out = vec![(0, None); steps.len()];
            for key in keys {
                let mut value = stored
                    .get(key)
                    .and_then(|b| WindowValue::unpack(b, now))
                    .unwrap_or_default();
                for (i, step) in steps.iter().enumerate().filter(|(_, s)| s.key == key) {
                    out[i] = value.step(step, now);
                }
                value.finish(now);
                if value.changed() {
                    match value.packed(now) {
                        Some((bytes, _)) => {
                            stored.insert(key.to_owned(), bytes);
                        }
                        None => {
                            stored.remove(key);
                        }
                    }
                }
            }
            assert_eq!(in_memory, out, "round {round}: {steps:#?}");
        }
    }
}
