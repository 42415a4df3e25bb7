//! The service-wide login guard: credential stuffing spread over many networks.
//!
//! Stuffing from a proxy pool of residential addresses makes one attempt per address, a few
//! per network and autonomous system: no per-address, per-network or per-ASN window sees it.
//! What it cannot hide is the service's own failure rate. The guard counts every login's
//! outcome service-wide in a sliding window, failures from contexts their accounts know
//! (a mistype on one's own phone, a forced re-login, a password-reset campaign) apart from
//! the others. When failures from unknown contexts are at least
//! `lockout.stuffing.min_failures` and either `failure_share` of all logins or, once the
//! service's normal for the hour of the day is learned ([`Baseline`]), `surge_factor` times
//! that normal (successes of the attacker's own accounts cannot dilute it), it turns on for
//! `hold_s`. While it is on, a login (an `auth` request naming an account) from a context
//! the account does not know gets a login challenge (reason `login_guard`); one the account
//! knows (an address, network or device it logged in from) passes with a step-up challenge.
//!
//! Logins refused from contexts their accounts do not know (by the guard, or by a network's
//! spraying block) count as failures, once per client (an IPv6 /64 is one) and slot: a
//! stuffing run that goes on is still seen while it is stopped, so the guard holds until
//! the run ends instead of letting a window's worth through each time it would lapse, while
//! one client sending refused logins fast cannot hold it on by itself. Logins dated before the window (a
//! backlog, an import) are not counted.
//!
//! The window is [`SLOTS`] time slots. In process the counts here are the whole truth; with
//! Redis each instance adds what it counted to one hash per slot each second and reads
//! every instance's sums back ([`LoginGuard::flush`]), so all instances judge the same totals;
//! the guard's end is shared the same way, so an instance started during a hold enforces it,
//! and so is the learned normal, so an instance that starts judges with it at once.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::Clock;
use crate::config::StuffingSettings;
use crate::model::ClientIp;
use crate::store::{Error, Hot, Keys};
use crate::telemetry::metrics as names;

mod normal; // the learned normal per hour of the day

use normal::Baseline;

/// Slots of the window.
pub const SLOTS: usize = 10;

/// Logins counted in one slot of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    /// Slot number (Unix ms ÷ slot length); a tally of another slot is stale.
    slot: i64,
    /// Failed logins from contexts their accounts do not know.
    failures: u64,
    successes: u64,
    /// Logins stopped (refused or challenged) from contexts their accounts do not know.
    refused: u64,
    /// Failed logins from contexts their accounts know (a mistype on one's own phone).
    known: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.failures += other.failures;
        self.successes += other.successes;
        self.refused += other.refused;
        self.known += other.known;
    }
}

/// A window's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Sums {
    /// Failed and stopped logins from contexts their accounts do not know.
    unknown: u64,
    /// Failed logins from contexts their accounts know.
    known: u64,
    successes: u64,
}

#[derive(Debug, Default)]
struct Counts {
    /// Counted here and not yet added to Redis (in process: everything counted).
    local: [Tally; SLOTS],
    /// Every instance's sums as last read from Redis (in process: empty).
    shared: [Tally; SLOTS],
    /// The addresses refused in slot `seen_slot` (hashed): one address counts once a slot.
    seen: std::collections::HashSet<u64, foldhash::fast::RandomState>,
    seen_slot: i64,
}

/// Most addresses remembered a slot; past it every refusal counts.
const MAX_SEEN: usize = 65_536;

/// What the guard sees in its window now.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct GuardState {
    /// Failed logins and logins the guard stopped, service-wide, in the window.
    pub failures: u64,
    /// Of them, failed and stopped logins from contexts their accounts do not know: what
    /// the guard judges.
    pub unknown_failures: u64,
    /// Successful logins in the window.
    pub successes: u64,
    /// Unix ms the guard is on until (0: it has not been on).
    pub active_until_ms: i64,
    /// Failures from unknown contexts in one window that turn the guard on now.
    pub threshold: u64,
    /// Whether the hour's normal is learned: `threshold` failures turn the guard on
    /// whatever their share of all logins (before, `failure_share` is asked too).
    pub learned: bool,
    /// The service's normal count of them for this hour of the day, once learned.
    pub normal: Option<f64>,
}

/// The guard of one instance.
#[derive(Debug)]
pub struct LoginGuard {
    settings: StuffingSettings,
    hot: Hot,
    keys: Keys,
    clock: Arc<dyn Clock>,
    counts: Mutex<Counts>,
    baseline: Mutex<Baseline>,
    active_until: AtomicI64,
    /// Released by an analyst until then (Unix ms): off, and no judgement turns it on.
    released_until: AtomicI64,
}

impl LoginGuard {
    /// The guard (`lockout.stuffing`), its counts in the Redis hashes
    /// `<prefix>:v1:{login_guard}:<slot>`.
    pub fn new(settings: StuffingSettings, hot: Hot, keys: &Keys, clock: Arc<dyn Clock>) -> Self {
        Self {
            settings,
            hot,
            keys: keys.clone(),
            clock,
            counts: Mutex::new(Counts::default()),
            baseline: Mutex::new(Baseline::default()),
            active_until: AtomicI64::new(0),
            released_until: AtomicI64::new(0),
        }
    }

    /// The Redis hash of one slot's counts.
    fn slot_key(&self, slot: i64) -> String {
        self.keys.login_guard(&slot.to_string())
    }

    /// False when `min_failures` is 0 (the guard is off).
    pub fn enabled(&self) -> bool {
        self.settings.min_failures > 0
    }

    fn slot_ms(&self) -> i64 {
        let window = i64::try_from(self.settings.window_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        (window / SLOTS as i64).max(1)
    }

    /// True while the guard is on (every login check of the `auth` class asks).
    pub fn is_active(&self) -> bool {
        if !self.enabled() {
            return false;
        }
        let now = self.clock.now_ms();
        self.active_until.load(Ordering::Acquire) > now
            && self.released_until.load(Ordering::Acquire) <= now
    }

    /// Turns the guard off until `until_ms`, whatever the window says (an analyst's call:
    /// the failures are not an attack, say an auth service that reports every login as
    /// failed). With Redis every instance follows within a second.
    pub async fn release(&self, until_ms: i64) -> Result<(), Error> {
        let now = self.clock.now_ms();
        self.released_until.fetch_max(until_ms, Ordering::AcqRel);
        self.active_until.store(0, Ordering::Release);
        metrics::gauge!(names::LOGIN_GUARD_ACTIVE).set(0.0);
        if let Hot::Redis(redis) = &self.hot {
            let mut pipe = redis::pipe();
            pipe.cmd("DEL").arg(self.keys.login_guard("until")).ignore();
            pipe.cmd("SET")
                .arg(self.keys.login_guard("released"))
                .arg(until_ms)
                .arg("PX")
                .arg((until_ms - now).max(1))
                .ignore();
            redis.query_pipeline::<()>(&pipe).await?;
        }
        Ok(())
    }

    /// Until when an analyst released the guard (Unix ms; in the past: not released).
    pub fn released_until(&self) -> i64 {
        self.released_until.load(Ordering::Acquire)
    }

    /// The window, ms: logins dated before it are not counted (a backlog, an import).
    pub fn window_ms(&self) -> i64 {
        self.slot_ms().saturating_mul(SLOTS as i64)
    }

    /// Counts logins: failed from contexts their accounts do not know (`unknown`), failed
    /// from contexts they know (`known`: judged by no threshold, so a forced re-login or a
    /// password-reset campaign of one's own users never turns the guard on), and
    /// successful; then judges the window.
    pub fn count(&self, unknown: u64, known: u64, successes: u64) {
        self.add(
            Tally {
                failures: unknown,
                known,
                successes,
                ..Tally::default()
            },
            None,
        );
    }

    /// Counts a login refused from a context its account does not know (by a network's
    /// block or by the guard) as a failure, once per client and slot (an IPv4 address, an
    /// IPv6 client's prefix, as budgets key them): a proxy pool's many addresses keep the
    /// guard on, one client sending refused logins fast, from however many addresses of its
    /// /64, does not.
    pub fn refused(&self, ip: &ClientIp) {
        self.add(Tally::default(), Some(ip));
    }

    fn add(&self, counted: Tally, refused: Option<&ClientIp>) {
        if !self.enabled()
            || (counted.failures + counted.known + counted.successes == 0 && refused.is_none())
        {
            return;
        }
        let now = self.clock.now_ms();
        let slot = now / self.slot_ms();
        let state = {
            let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            let previous = self.previous(&counts, slot);
            let refused = match refused {
                None => 0,
                Some(ip) => {
                    if counts.seen_slot != slot {
                        counts.seen.clear();
                        counts.seen_slot = slot;
                    }
                    let hash = counts.seen.hasher().hash_one(client_bits(ip));
                    let full = counts.seen.len() >= MAX_SEEN;
                    u64::from(counts.seen.insert(hash) || full)
                }
            };
            let tally = &mut counts.local[slot_index(slot)];
            if tally.slot != slot {
                *tally = Tally {
                    slot,
                    ..Tally::default()
                };
            }
            tally.add(&Tally {
                slot,
                refused,
                ..counted
            });
            (sums(&counts, slot), previous)
        };
        self.judge(state, now);
    }

    /// The window's totals and until when the guard is on.
    pub fn state(&self) -> GuardState {
        let now = self.clock.now_ms();
        let slot = now / self.slot_ms();
        let sums = {
            let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            sums(&counts, slot)
        };
        let normal = self
            .baseline
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .normal(now);
        GuardState {
            failures: sums.unknown + sums.known,
            unknown_failures: sums.unknown,
            successes: sums.successes,
            active_until_ms: self.active_until.load(Ordering::Acquire),
            threshold: self.threshold(normal),
            learned: normal.is_some(),
            normal,
        }
    }

    /// Failures from unknown contexts in a window that turn the guard on: `min_failures`,
    /// or once the hour's normal is learned, `surge_factor` times it if that is more.
    fn threshold(&self, normal: Option<f64>) -> u64 {
        let surge = normal.map_or(0.0, |n| n * self.settings.surge_factor);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // ceil of a count
        let surge = surge.ceil().max(0.0) as u64;
        self.settings.min_failures.max(surge)
    }

    /// The last window the baseline learned from (0 before any).
    fn learned_through(&self) -> i64 {
        let baseline = self.baseline.lock().unwrap_or_else(PoisonError::into_inner);
        if baseline.is_empty() {
            0
        } else {
            baseline.sampled
        }
    }

    /// At the first judgement of a window, the window before it (the `SLOTS` slots before
    /// `slot`), for the baseline to learn; taken before this judgement's counts go in.
    fn previous(&self, counts: &Counts, slot: i64) -> Option<(i64, Sums)> {
        let window = slot / SLOTS as i64;
        let mut baseline = self.baseline.lock().unwrap_or_else(PoisonError::into_inner);
        if baseline.sampled == 0 {
            // Nothing seen of the window before this instance started.
            baseline.sampled = window;
            return None;
        }
        (window > baseline.sampled)
            .then(|| (window, sums_between(counts, slot - SLOTS as i64, slot - 1)))
    }

    /// Turns the guard on (or keeps it on) when the window's failures from unknown contexts
    /// are enough: at least `min_failures`, and either `failure_share` of all logins or,
    /// once the hour's normal is learned, `surge_factor` times that normal whatever the
    /// share (an attacker who also logs into accounts of its own cannot dilute it). Each
    /// window judged while the guard is off teaches the hour's normal.
    fn judge(&self, (sums, previous): (Sums, Option<(i64, Sums)>), now: i64) {
        let normal = {
            let mut baseline = self.baseline.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((window, previous)) = previous {
                // A window the guard was on for is an attack's, not the normal.
                let quiet = !self.is_active();
                baseline.learn(window, previous.unknown, now, quiet);
            }
            baseline.normal(now)
        };
        if self.released_until.load(Ordering::Acquire) > now {
            return;
        }
        let settings = &self.settings;
        let failures = sums.unknown;
        let all = sums.unknown + sums.known + sums.successes;
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        let share = failures as f64 / all.max(1) as f64;
        let surge = normal.is_some() && failures >= self.threshold(normal);
        let on = failures >= settings.min_failures && (share >= settings.failure_share || surge);
        if !on {
            return;
        }
        let successes = sums.successes;
        let hold = i64::try_from(settings.hold_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let until = now.saturating_add(hold);
        let before = self.active_until.fetch_max(until, Ordering::AcqRel);
        if before <= now {
            metrics::counter!(names::LOGIN_GUARD_ACTIVATIONS_TOTAL).increment(1);
            metrics::gauge!(names::LOGIN_GUARD_ACTIVE).set(1.0);
            tracing::warn!(
                failures,
                successes,
                "login guard on: {failures} failed logins from unknown contexts and {successes} successful ones service-wide in {} s; logins from contexts their accounts do not know get a login challenge for {} s",
                settings.window_s,
                settings.hold_s
            );
        }
    }

    /// Adds this instance's counts to Redis and reads every instance's sums back, then
    /// judges them (nothing to do in process). Counts that could not be added are kept
    /// for the next call.
    pub async fn flush(&self) -> Result<(), Error> {
        metrics::gauge!(names::LOGIN_GUARD_ACTIVE).set(f64::from(u8::from(self.is_active())));
        let Hot::Redis(redis) = &self.hot else {
            return Ok(());
        };
        if !self.enabled() {
            return Ok(());
        }
        let now = self.clock.now_ms();
        let slot = now / self.slot_ms();
        let pending: Vec<Tally> = {
            let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            let taken = std::mem::take(&mut counts.local);
            taken
                .into_iter()
                .filter(|t| {
                    t.slot > slot - SLOTS as i64
                        && t.failures + t.successes + t.refused + t.known > 0
                })
                .collect()
        };
        // One hash a slot (`f`, `s`, `r`, `k`), expiring two windows after its last write;
        // all in one cluster slot (the hash tag).
        let window_ms = self.slot_ms().saturating_mul(2 * SLOTS as i64);
        let mut pipe = redis::pipe();
        for tally in &pending {
            let key = self.slot_key(tally.slot);
            for (field, n) in ["f", "s", "r", "k"].into_iter().zip([
                tally.failures,
                tally.successes,
                tally.refused,
                tally.known,
            ]) {
                if n > 0 {
                    pipe.cmd("HINCRBY").arg(&key).arg(field).arg(n).ignore();
                }
            }
            pipe.cmd("PEXPIRE").arg(&key).arg(window_ms).ignore();
        }
        let old = slot - SLOTS as i64;
        for s in old + 1..=slot {
            pipe.cmd("HMGET")
                .arg(self.slot_key(s))
                .arg(&["f", "s", "r", "k"]);
        }
        // Until when another instance's judgement keeps the guard on (one restarted in the
        // middle of a hold learns it here).
        let until_key = self.keys.login_guard("until");
        let baseline_key = self.keys.login_guard("baseline");
        pipe.cmd("GET").arg(&baseline_key);
        pipe.cmd("GET").arg(self.keys.login_guard("released"));
        pipe.cmd("GET").arg(&until_key);
        let result: Result<Vec<redis::Value>, Error> = redis.query_pipeline(&pipe).await;
        let shared_until: i64;
        let learned_before = self.learned_through();
        let state = {
            let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            // What the instances learned, before this one's first window is taken.
            if let Ok(replies) = &result
                && let Some(shared) = replies
                    .len()
                    .checked_sub(3)
                    .and_then(|at| {
                        redis::from_redis_value::<Option<String>>(replies[at].clone()).ok()
                    })
                    .flatten()
                    .and_then(|json| serde_json::from_str::<Baseline>(&json).ok())
            {
                self.baseline
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .adopt(shared);
            }
            let previous = self.previous(&counts, slot);
            match result {
                Ok(mut replies) => {
                    let mut number = || {
                        replies
                            .pop()
                            .and_then(|v| redis::from_redis_value::<Option<i64>>(v).ok())
                            .flatten()
                            .unwrap_or(0)
                    };
                    shared_until = number();
                    let released = number();
                    replies.pop(); // the baseline, taken above
                    self.released_until.fetch_max(released, Ordering::AcqRel);
                    if released > now {
                        // An analyst's release ends this instance's hold too: when it
                        // runs out, the window's failures are judged anew.
                        self.active_until.store(0, Ordering::Release);
                    } else {
                        self.active_until.fetch_max(shared_until, Ordering::AcqRel);
                    }
                    let values: Vec<Vec<Option<u64>>> = replies
                        .into_iter()
                        .map(|v| redis::from_redis_value(v).unwrap_or_default())
                        .collect();
                    for (i, s) in (old + 1..=slot).enumerate() {
                        let at = |k: usize| {
                            values
                                .get(i)
                                .and_then(|v| v.get(k).copied().flatten())
                                .unwrap_or(0)
                        };
                        counts.shared[slot_index(s)] = Tally {
                            slot: s,
                            failures: at(0),
                            successes: at(1),
                            refused: at(2),
                            known: at(3),
                        };
                    }
                }
                Err(err) => {
                    for tally in &pending {
                        let local = &mut counts.local[slot_index(tally.slot)];
                        if local.slot != tally.slot {
                            *local = Tally {
                                slot: tally.slot,
                                ..Tally::default()
                            };
                        }
                        local.add(tally);
                    }
                    return Err(err);
                }
            }
            (sums(&counts, slot), previous)
        };
        self.judge(state, now);
        // A window learned here is kept for the other instances and the next start (a
        // month: every hour of the day is learned again long before).
        if self.learned_through() > learned_before {
            let json = {
                let baseline = self.baseline.lock().unwrap_or_else(PoisonError::into_inner);
                serde_json::to_string(&*baseline).unwrap_or_default()
            };
            redis
                .query::<()>(
                    redis::cmd("SET")
                        .arg(&baseline_key)
                        .arg(json)
                        .arg("PX")
                        .arg(30 * 86_400_000_i64),
                )
                .await?;
        }
        // This instance's end of the guard, when later than the one read, for the others.
        let until = self.active_until.load(Ordering::Acquire);
        // Not when an analyst released the guard since the read above: the release wins.
        if until > now && until > shared_until {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(SET_UNLESS_RELEASED)
                .arg(2)
                .arg(&until_key)
                .arg(self.keys.login_guard("released"))
                .arg(until)
                .arg(until - now);
            redis.query::<()>(&cmd).await?;
        }
        Ok(())
    }
}

/// `SET KEYS[1] ARGV[1] PX ARGV[2]` unless `KEYS[2]` (the release) exists; both keys share
/// the guard's hash tag, so one cluster slot.
const SET_UNLESS_RELEASED: &str = "if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end return 0";

/// The client as budgets key it: an IPv4 address, an IPv6 address's prefix.
fn client_bits(ip: &ClientIp) -> (u8, u128) {
    match ip.addr() {
        std::net::IpAddr::V4(v4) => (4, u128::from(u32::from(v4))),
        std::net::IpAddr::V6(v6) => {
            let shift = 128 - u32::from(ip.ipv6_prefix_len());
            (6, u128::from(v6).checked_shr(shift).unwrap_or(0))
        }
    }
}

fn slot_index(slot: i64) -> usize {
    usize::try_from(slot.rem_euclid(SLOTS as i64)).unwrap_or(0)
}

/// The window ending in `slot`.
fn sums(counts: &Counts, slot: i64) -> Sums {
    sums_between(counts, slot - SLOTS as i64 + 1, slot)
}

/// The slots from `first` to `last`, both included.
fn sums_between(counts: &Counts, first: i64, last: i64) -> Sums {
    let mut total = Tally::default();
    for tally in counts.local.iter().chain(&counts.shared) {
        if tally.slot >= first && tally.slot <= last {
            total.add(tally);
        }
    }
    Sums {
        unknown: total.failures + total.refused,
        known: total.known,
        successes: total.successes,
    }
}

#[cfg(test)]
mod tests;
