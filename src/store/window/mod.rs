//! The window model: sliding windows of login failures packed into one value per subject.
//!
//! This is the specification, and its in-process implementation. `lua/velocity_batch.lua`
//! implements the same steps in Redis (on a cluster, and for values another instance changed
//! between a read and a write); `lua/window_cas.lua` writes values computed here. The cases in
//! [`spec`] run against all three (`tests/api/window.rs`). Spec, twin and cases stay in one
//! file (a little over 600 lines) so that a change to one is read beside the others.
//!
//! - **A value** holds named windows (an account's failures `f`, its failures per IP `i…` and
//!   per device `d…`, its quick-login window `q`; an IP's failures `f` and distinct accounts
//!   `a`; an account's known contexts `k`). Packed: per window `#name name expires n
//!   entries`, each entry a member id and a score (16 bytes), sorted by score.
//! - **A window** ends `window_ms` after its last addition (`expires`); its entries count while
//!   their score is at or after `now − window_ms`.
//! - **Record** adds the member with its score unless the score is before the window (it would
//!   not count) or the member is already in range (a retry counts once and keeps its first
//!   score); at most `cap` newest entries are kept. It answers the count, and with `gap` the
//!   smallest difference between neighbouring scores.
//! - **Contains** answers 1 if the member is in range; **Remove** takes it out; **Delete**
//!   drops the window. Counting or asking never creates a value or a window.
//! - **Bound**: at the end of a call, a value keeps at most [`MAX_WINDOWS_PER_KIND`] live
//!   windows of each kind the call created windows of, dropping empty and least recently
//!   added ones.

use smallvec::SmallVec;

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
    /// Drops the windows past their expiry (the in-process store sweeps with it).
    pub(super) fn drop_expired(&mut self, now_ms: i64) {
        self.windows.retain(|(_, w)| w.expires_ms > now_ms);
    }

    /// True when it holds no window.
    pub(super) fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// How many windows it holds (live or not).
    #[cfg(test)]
    pub(super) fn window_count(&self) -> usize {
        self.windows.len()
    }

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

/// The specification's cases: each a sequence of calls and what each step must answer.
///
/// `spec::cases` runs in-process here and against Redis and a Redis Cluster in
/// `tests/api/window.rs`, so the Rust twin and `lua/velocity_batch.lua` are held to the same
/// answers.
pub mod spec {
    use super::{WindowAction, WindowStep};

    /// One step's answer: the count and, when asked, the smallest gap.
    pub type Answer = (u32, Option<i64>);

    /// A named case: calls in order, each `(now_ms, steps, answers)`; keys are names to be
    /// prefixed by the runner.
    #[derive(Debug, Clone)]
    pub struct Case {
        /// What the case shows.
        pub name: &'static str,
        /// The calls.
        pub calls: Vec<(i64, Vec<WindowStep>, Vec<Answer>)>,
    }

    const T: i64 = 1_800_000_000_000;
    const W: i64 = 600_000;

    fn step(key: &str, window: &str, member: Option<u64>, score: i64) -> WindowStep {
        WindowStep {
            key: key.to_owned(),
            window: window.to_owned(),
            member,
            score,
            window_ms: W,
            cap: 5,
            gap: false,
            action: WindowAction::Record,
        }
    }

    fn with(step: WindowStep, action: WindowAction) -> WindowStep {
        WindowStep { action, ..step }
    }

    fn gap(step: WindowStep) -> WindowStep {
        WindowStep { gap: true, ..step }
    }

    /// Every case.
    pub fn cases() -> Vec<Case> {
        vec![
            Case {
                name: "a member counts once; a retry keeps its first score",
                calls: vec![
                    (
                        T,
                        vec![step("a", "f", Some(1), T), step("a", "f", Some(1), T)],
                        vec![(1, None), (1, None)],
                    ),
                    // The retry comes later: the entry still ages out from its first score.
                    (
                        T + W - 1,
                        vec![step("a", "f", Some(1), T + W - 1)],
                        vec![(1, None)],
                    ),
                    (T + W, vec![step("a", "f", None, 0)], vec![(0, None)]),
                ],
            },
            Case {
                name: "an entry older than the window is not added",
                calls: vec![(
                    T,
                    vec![step("b", "f", Some(1), T - W - 1), step("b", "f", None, 0)],
                    vec![(0, None), (0, None)],
                )],
            },
            Case {
                name: "entries age out one by one; the window ends with its last addition",
                calls: vec![
                    (
                        T,
                        vec![
                            step("c", "f", Some(1), T - 300_000),
                            step("c", "f", Some(2), T),
                        ],
                        vec![(1, None), (2, None)],
                    ),
                    (T + 300_001, vec![step("c", "f", None, 0)], vec![(1, None)]),
                    (T + W, vec![step("c", "f", None, 0)], vec![(0, None)]),
                ],
            },
            Case {
                name: "at most cap newest entries are kept",
                calls: vec![(
                    T,
                    (1..=7)
                        .map(|m| step("d", "f", Some(m), T + m as i64))
                        .chain([step("d", "f", Some(1), T + 1)])
                        .collect(),
                    vec![
                        (1, None),
                        (2, None),
                        (3, None),
                        (4, None),
                        (5, None),
                        (5, None),
                        (5, None),
                        (5, None),
                    ],
                )],
            },
            Case {
                name: "the gap is the smallest between neighbours, zero included, in any order",
                calls: vec![
                    (
                        T,
                        vec![
                            gap(step("e", "q", Some(1), T - 30_000)),
                            gap(step("e", "q", Some(2), T - 20_000)),
                        ],
                        vec![(1, None), (2, Some(10_000))],
                    ),
                    (
                        T,
                        vec![gap(step("e", "q", Some(3), T - 29_600))],
                        vec![(3, Some(400))],
                    ),
                    (
                        T,
                        vec![gap(step("e", "q", Some(4), T - 20_000))],
                        vec![(4, Some(0))],
                    ),
                ],
            },
            Case {
                name: "contains, remove and delete; asking never creates a window",
                calls: vec![
                    (
                        T,
                        vec![
                            with(step("g", "f", Some(9), T), WindowAction::Contains),
                            step("g", "f", None, 0),
                        ],
                        vec![(0, None), (0, None)],
                    ),
                    (
                        T,
                        vec![
                            step("g", "f", Some(1), T),
                            step("g", "f", Some(2), T),
                            with(step("g", "f", Some(1), 0), WindowAction::Contains),
                        ],
                        vec![(1, None), (2, None), (1, None)],
                    ),
                    (
                        T,
                        vec![
                            with(step("g", "f", Some(1), 0), WindowAction::Remove),
                            with(step("g", "f", Some(7), 0), WindowAction::Remove),
                        ],
                        vec![(1, None), (1, None)],
                    ),
                    (
                        T,
                        vec![
                            with(step("g", "f", None, 0), WindowAction::Delete),
                            step("g", "f", None, 0),
                        ],
                        vec![(0, None), (0, None)],
                    ),
                ],
            },
            Case {
                name: "windows of one value are independent",
                calls: vec![(
                    T,
                    vec![
                        step("h", "f", Some(1), T),
                        step("h", "i1", Some(1), T),
                        step("h", "i2", Some(2), T),
                        step("h", "f", Some(2), T),
                    ],
                    vec![(1, None), (1, None), (1, None), (2, None)],
                )],
            },
        ]
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn the_in_process_twin_answers_every_case() {
            for case in super::cases() {
                let memory = crate::store::MemoryHot::new();
                for (now, steps, answers) in &case.calls {
                    assert_eq!(&memory.window_steps(steps, *now), answers, "{}", case.name);
                }
            }
        }
    }
}

/// The single-Redis path reads each value, steps it here and writes it back packed; the
/// in-process store keeps the value. Random sequences (every action, expiring and aging
/// windows, caps) must answer the same either way.
#[cfg(test)]
mod round_trip;
