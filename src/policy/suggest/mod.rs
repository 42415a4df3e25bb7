//! Budgets from real traffic.
//!
//! For every budget: how much of it each key spent per period of that budget, over the keys
//! the engine did not flag, and a candidate `[limits]` that keeps a chosen share of them
//! under every budget.
//!
//! One pass over the record in time order. Each budget counts its keys' tokens in fixed
//! windows of its own period, and in the busiest tenth of each window: a check's cost over
//! its subject's multiplier, what it spends of the budget as configured (one check of a
//! device at 0.25 spends 4). When a window ends, each key's count goes into a histogram and the key is forgotten, so memory grows with the keys
//! of one window and the number of budgets, never with the record. The histograms
//! (HdrHistogram, two significant digits) merge and answer both "the count at this quantile"
//! and "how many key-windows exceed this value".
//!
//! A key-window is **flagged** (left out of the honest population) when one of its checks
//! had a multiplier below 1 on the budget's own subject (deny lists, offenders, anomalies,
//! lockouts, datacenter and Tor ranges, overrides: the address for address budgets, the
//! account for account budgets, so honest users behind a flagged carrier address stay
//! honest users; a device below what any device without an attestation verdict has on that
//! class), or was challenged, or when more than a quarter of its checks were refused
//! (a client that kept asking after its 429s; one that waits as `Retry-After` says is refused
//! a few times at most). A key flagged in any window is flagged in all of them (the second
//! pass of [`propose`]). Global budgets guard capacity, which the traffic does not show, and
//! budgets keyed by a message's recipient or destination are not in the record: both keep
//! their values.

mod proof;
mod report;

pub use proof::{Holdout, Proposal, propose};
pub use report::{BudgetSuggestion, FlaggedKey, Suggestion, limits_toml, readable};

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::record::{Outcome, Recorded};
use crate::config::{LimitSettings, ScopeKind};
use crate::limiter::Budgets;
use crate::limiter::budgets::Present;

/// How a suggestion is made.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Options {
    /// Percent of honest key-windows each suggested budget keeps under it (e.g. 99.9).
    pub honest: f64,
    /// The suggested value is the honest quantile times this, rounded up to a readable
    /// number.
    pub headroom: f64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            honest: 99.9,
            headroom: 1.25,
        }
    }
}

impl Options {
    /// Checks the ranges: `honest` in (0, 100], `headroom` in [1, 10].
    pub fn validate(&self) -> Result<(), String> {
        if !(self.honest > 0.0 && self.honest <= 100.0) {
            return Err("honest must be a percentage above 0 and at most 100".to_owned());
        }
        if !(1.0..=10.0).contains(&self.headroom) {
            return Err("headroom must be between 1 and 10".to_owned());
        }
        Ok(())
    }
}

/// One key's checks in the current window of one budget.
#[derive(Debug, Default)]
struct KeyWindow {
    /// Checks, and of them refused.
    count: u32,
    refused: u32,
    /// Tokens at multiplier 1: each check's cost over its subject's multiplier (a device at
    /// 0.25 spends four of the budget's tokens per token it asks for).
    tokens: f64,
    flagged: bool,
    /// The tenth of the window the last check fell in, its tokens, and the most in any tenth.
    tenth: i64,
    tenth_tokens: f64,
    busiest_tenth: f64,
}

impl KeyWindow {
    fn tokens(&self) -> u64 {
        (self.tokens - 1e-9).ceil().max(1.0) as u64
    }
}

/// Flagged key-windows kept by name per budget, the largest first.
const TOP_FLAGGED: usize = 5;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, u64::from(u32::MAX), 2).expect("valid histogram bounds")
}

/// One budget's counts.
#[derive(Debug)]
struct Tally {
    period_ms: i64,
    window: i64,
    keys: HashMap<String, KeyWindow>,
    honest: Histogram<u64>,
    flagged: Histogram<u64>,
    /// The busiest tenth of honest key-windows.
    burst: Histogram<u64>,
    checks: u64,
    top_flagged: Vec<(u32, String)>,
}

impl Tally {
    fn new(period_s: u32) -> Self {
        Self {
            period_ms: i64::from(period_s.max(1)) * 1000,
            window: i64::MIN,
            keys: HashMap::new(),
            honest: histogram(),
            flagged: histogram(),
            burst: histogram(),
            checks: 0,
            top_flagged: Vec::new(),
        }
    }

    /// Ends the current window: every key's count into the histograms.
    fn roll(&mut self, across: &mut Across) {
        for (key, w) in self.keys.drain() {
            let tokens = w.tokens();
            let flagged =
                w.flagged || u64::from(w.refused) * 4 > u64::from(w.count) || across.excludes(&key);
            if flagged {
                self.flagged.saturating_record(tokens);
                across.collect(&key);
                let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
                match self.top_flagged.iter_mut().find(|(_, k)| *k == key) {
                    Some(top) => top.0 = top.0.max(tokens),
                    None => self.top_flagged.push((tokens, key)),
                }
                self.top_flagged
                    .sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                self.top_flagged.truncate(TOP_FLAGGED);
            } else {
                self.honest.saturating_record(tokens);
                self.burst
                    .saturating_record((w.busiest_tenth - 1e-9).ceil().max(1.0) as u64);
            }
        }
    }

    fn add(
        &mut self,
        key: &str,
        at_ms: i64,
        (flagged, refused): (bool, bool),
        tokens: f64,
        across: &mut Across,
    ) {
        let window = at_ms.div_euclid(self.period_ms);
        if window != self.window {
            self.roll(across);
            self.window = window;
        }
        self.checks += 1;
        let tenth = at_ms.div_euclid((self.period_ms / 10).max(1));
        let w = match self.keys.get_mut(key) {
            Some(w) => w,
            None => self.keys.entry(key.to_owned()).or_insert(KeyWindow {
                tenth,
                ..KeyWindow::default()
            }),
        };
        w.count += 1;
        w.refused += u32::from(refused);
        w.tokens += tokens;
        w.flagged |= flagged;
        if w.tenth != tenth {
            w.tenth = tenth;
            w.tenth_tokens = 0.0;
        }
        w.tenth_tokens += tokens;
        w.busiest_tenth = w.busiest_tenth.max(w.tenth_tokens);
    }
}

/// Counts recorded checks per budget and key; [`Summary::suggest`] makes the candidate.
#[derive(Debug)]
pub struct Summary {
    budgets: Budgets,
    tallies: Vec<Tally>,
    /// Checks read.
    pub records: u64,
    /// Checks whose answer was recorded (the rest count as honest).
    pub with_signals: u64,
    /// First and last check's time, Unix ms.
    pub span_ms: Option<(i64, i64)>,
    across: Across,
    /// Per class, the device multiplier every device without an attestation verdict has
    /// there: a device at or above it is not flagged.
    device_floor: Vec<f64>,
}

/// Most keys remembered across windows as flagged (a few tens of MB at most); past it, keys
/// are judged per window.
const MAX_REMEMBERED: usize = 1_000_000;

/// Keys flagged in one window, carried across windows: collected in a first pass, left out
/// of the honest population in a second.
#[derive(Debug, Default)]
struct Across {
    keys: HashSet<String>,
    collecting: bool,
}

impl Across {
    fn collect(&mut self, key: &str) {
        if self.collecting && self.keys.len() < MAX_REMEMBERED && !self.keys.contains(key) {
            self.keys.insert(key.to_owned());
        }
    }

    fn excludes(&self, key: &str) -> bool {
        !self.collecting && self.keys.contains(key)
    }
}

/// The key a check has under a budget of `scope` (None: the check names no such subject, or
/// the record does not keep it).
fn key_of(scope: ScopeKind, r: &Recorded) -> Option<Cow<'_, str>> {
    match scope {
        ScopeKind::Ip | ScopeKind::EndpointIp => Some(Cow::Borrowed(r.ip.as_str())),
        ScopeKind::User | ScopeKind::EndpointUser => r.user.as_deref().map(Cow::Borrowed),
        ScopeKind::Device => r.device.as_deref().map(Cow::Borrowed),
        ScopeKind::IpDevice => r
            .device
            .as_deref()
            .map(|d| Cow::Owned(format!("{d}@{}", r.ip))),
        ScopeKind::Tenant => r.tenant.as_deref().map(Cow::Borrowed),
        ScopeKind::Global | ScopeKind::Recipient | ScopeKind::Destination => None,
    }
}

impl Summary {
    /// Empty counts for the budgets of `live`.
    pub fn new(live: &LimitSettings) -> Self {
        Self {
            budgets: Budgets::from_settings(live),
            tallies: live
                .budgets
                .iter()
                .map(|b| Tally::new(b.period_s))
                .collect(),
            records: 0,
            with_signals: 0,
            span_ms: None,
            across: Across::default(),
            device_floor: Vec::new(),
        }
    }

    /// Takes `floor(class)` as the device multiplier of a device without an attestation
    /// verdict on that class (see [`device_floor`]): the baseline of an unverified device on
    /// a public class (0.25 by default) is no flag.
    pub fn with_device_floor(mut self, floor: impl Fn(&str) -> f64) -> Self {
        self.device_floor = self
            .budgets
            .classes
            .iter()
            .map(|c| floor(&c.name))
            .collect();
        self
    }

    /// Also collects every key flagged in any window, for [`Summary::excluding`] (memory then
    /// grows with flagged keys, up to a million).
    pub fn collecting_flagged(mut self) -> Self {
        self.across.collecting = true;
        self
    }

    /// Counts every window of `keys` as flagged: a client flagged once (a scraper refused
    /// most of the time, an offender) is left out of the honest population for the whole
    /// record, its first window too.
    pub fn excluding(mut self, keys: HashSet<String>) -> Self {
        self.across = Across {
            keys,
            collecting: false,
        };
        self
    }

    /// Ends every budget's current window (call after the last check).
    pub fn finish(mut self) -> Self {
        for tally in &mut self.tallies {
            tally.roll(&mut self.across);
        }
        self
    }

    /// The keys collected as flagged ([`Summary::collecting_flagged`]), after [`Self::finish`].
    pub fn flagged_keys(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.across.keys)
    }

    /// Counts one check (checks must come in time order).
    pub fn add(&mut self, r: &Recorded) {
        self.records += 1;
        self.with_signals += u64::from(r.outcome.is_some());
        self.span_ms = Some(match self.span_ms {
            None => (r.at_ms, r.at_ms),
            Some((first, _)) => (first, r.at_ms),
        });
        let challenged = r.outcome == Some(Outcome::Challenged);
        let refused = r.outcome == Some(Outcome::Refused);
        let class = self.budgets.classify(&r.method, &r.endpoint);
        let present = Present {
            user: r.user.is_some(),
            device: r.device.is_some(),
            tenant: r.tenant.is_some(),
            recipient: false,
            destination: false,
        };
        let Self {
            budgets,
            tallies,
            across,
            device_floor,
            ..
        } = self;
        let device_floor = device_floor.get(class).copied().unwrap_or(1.0);
        for index in budgets.applicable(class, present) {
            let scope = budgets.budgets[index].scope;
            if let Some(key) = key_of(scope, r) {
                let floor = match scope {
                    ScopeKind::Device | ScopeKind::IpDevice => device_floor,
                    _ => 1.0,
                };
                let multiplier = r.multipliers.of_scope(scope);
                let flagged = challenged || multiplier < floor;
                // Tokens at multiplier 1 (a blocked subject's are its cost: it is flagged).
                let tokens = if multiplier > 0.0 {
                    f64::from(r.cost) / multiplier
                } else {
                    f64::from(r.cost)
                };
                tallies[index].add(&key, r.at_ms, (flagged, refused), tokens, across);
            }
        }
    }

    /// The suggestion: every budget of `live` with its honest distribution and a value that
    /// keeps `options.honest` percent of honest key-windows under it.
    pub fn suggest(self, live: &LimitSettings, options: Options) -> Suggestion {
        let summary = self.finish();
        let mut candidate = live.clone();
        let mut budgets = Vec::with_capacity(live.budgets.len());
        for ((budget, tally), out) in live
            .budgets
            .iter()
            .zip(&summary.tallies)
            .zip(&mut candidate.budgets)
        {
            let honest = &tally.honest;
            let quantile = |q: f64| (!honest.is_empty()).then(|| honest.value_at_quantile(q));
            let above = |h: &Histogram<u64>, limit: u32| {
                let limit = u64::from(limit);
                if limit >= h.max() {
                    0
                } else {
                    h.len() - h.count_between(0, limit)
                }
            };
            let (suggested, note) = match (budget.scope, quantile(options.honest / 100.0)) {
                (ScopeKind::Global, _) => (
                    budget.limit,
                    "kept: a global budget guards capacity, which traffic does not show".to_owned(),
                ),
                (ScopeKind::Recipient | ScopeKind::Destination, _) => (
                    budget.limit,
                    "kept: the record does not keep recipients".to_owned(),
                ),
                (_, None) => (
                    budget.limit,
                    "kept: no honest traffic met it in the window".to_owned(),
                ),
                (_, Some(at)) => {
                    let value = readable(at as f64 * options.headroom);
                    let checks = if at == 1 { "token" } else { "tokens" };
                    let mut note = format!(
                        "{} % of honest keys spent at most {at} {checks} a period; × {} headroom",
                        options.honest, options.headroom
                    );
                    // A quantile needs 1 / (1 − q) samples to be more than the largest seen.
                    let needed = (100.0 / (100.0 - options.honest)).round();
                    if (honest.len() as f64) < needed {
                        note.push_str(&format!(
                            " (from {} key-windows, fewer than the {needed} this percentile needs: it is the largest seen)",
                            honest.len()
                        ));
                    }
                    (value, note)
                }
            };
            out.limit = suggested;
            // An explicit burst keeps its ratio to the limit.
            if let Some(burst) = budget.burst {
                let ratio = f64::from(burst) / f64::from(budget.limit.max(1));
                out.burst = Some(((f64::from(suggested) * ratio).ceil() as u32).max(suggested));
            }
            let stopped = tally
                .top_flagged
                .iter()
                .filter(|(count, _)| *count > suggested)
                .map(|(count, key)| FlaggedKey {
                    key: key.clone(),
                    checks: *count,
                    stopped_by_live: *count > budget.limit,
                })
                .collect();
            budgets.push(BudgetSuggestion {
                budget: budget.name.clone(),
                scope: budget.scope.as_str(),
                period_s: budget.period_s,
                checks: tally.checks,
                honest_keys: honest.len(),
                flagged_keys: tally.flagged.len(),
                p50: quantile(0.5),
                p90: quantile(0.9),
                p99: quantile(0.99),
                p999: quantile(0.999),
                max: quantile(1.0),
                busiest_tenth_p99: (!tally.burst.is_empty())
                    .then(|| tally.burst.value_at_quantile(0.99)),
                live: budget.limit,
                suggested,
                honest_over_live: above(honest, budget.limit),
                honest_over_suggested: above(honest, suggested),
                flagged_over_live: above(&tally.flagged, budget.limit),
                flagged_over_suggested: above(&tally.flagged, suggested),
                flagged_stopped: stopped,
                histogram: log_buckets(honest),
                note,
            });
        }
        let toml = limits_toml(&candidate);
        Suggestion {
            records: summary.records,
            with_signals: summary.with_signals,
            options,
            budgets,
            candidate,
            toml,
        }
    }
}

/// The device multiplier a device without an attestation verdict has on `class` under
/// `settings`: the `unverified` factor, of the public table on public classes.
pub fn device_floor(settings: &crate::config::Settings, class: &str) -> f64 {
    let public = settings.scoring.public_classes.iter().any(|c| c == class);
    settings.attestation.factor("unverified", public).min(1.0)
}

/// Counts of honest key-windows in power-of-two buckets: `(up to, key-windows)`.
fn log_buckets(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    h.iter_log(1, 2.0)
        .map(|v| (v.value_iterated_to(), v.count_since_last_iteration()))
        .filter(|(_, count)| *count > 0)
        .collect()
}

#[cfg(test)]
mod tests;
