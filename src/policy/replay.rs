//! Replay: recorded checks through the live and a candidate `[limits]` on simulated time.
//!
//! Each policy runs on its own in-process limiter (the twin of the Redis script); the
//! difference is reported per class and scope, with the keys it changes most.
//!
//! Scoring is modelled by replaying the multipliers recorded with each check
//! ([`Signals::Recorded`], the default): both policies see every subject scaled as the live
//! limiter scaled it at that moment (an offender halved, a locked account at 0). Checks
//! recorded before answers were kept replay at 1, as does [`Signals::One`]. The replay of
//! the live policy is compared with what the live limiter answered, per class, so a report
//! says how far its prediction can be trusted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::record::{Multipliers, Outcome, Recorded, read};
use crate::clock::{Clock, ManualClock};
use crate::config::LimitSettings;
use crate::limiter::{LimitRequest, Limiter, Verdict};
use crate::model::{ClientIp, SubjectKey};
use crate::store::{Durable, Error, Hot, Keys, MemoryHot};

/// How a replay models what scoring did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Signals {
    /// Each check's subjects get the multipliers the live limiter applied to it.
    #[default]
    Recorded,
    /// Every multiplier is held at 1 (the budgets alone).
    One,
}

impl Signals {
    /// `recorded` or `one`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "recorded" => Some(Signals::Recorded),
            "one" => Some(Signals::One),
            _ => None,
        }
    }
}

/// One policy's limiter over its own in-process buckets.
struct Side {
    limiter: Limiter,
    ipv6_prefix_len: u8,
    /// The multiplier in force per subject key (absent: 1).
    published: HashMap<SubjectKey, f64>,
}

impl Side {
    fn new(settings: &LimitSettings, clock: Arc<dyn Clock>) -> Self {
        Self {
            limiter: Limiter::new(
                settings,
                Hot::Memory(MemoryHot::new()),
                Keys::new("replay"),
                clock,
            )
            .unobserved(),
            ipv6_prefix_len: settings.ipv6_prefix_len,
            published: HashMap::new(),
        }
    }

    /// Puts `recorded` in force for the request's subjects, writing only what changed (most
    /// checks carry no multiplier, and the limiter then looks none up).
    async fn hold(&mut self, request: &LimitRequest, recorded: &Multipliers) {
        let subjects = [
            Some((SubjectKey::ip(&request.ip), recorded.ip)),
            request.user.clone().map(|s| (s, recorded.user)),
            request.device.clone().map(|s| (s, recorded.device)),
            request.tenant.clone().map(|s| (s, recorded.tenant)),
        ];
        for (subject, value) in subjects.into_iter().flatten() {
            let now = self.published.get(&subject).copied().unwrap_or(1.0);
            if now == value {
                continue;
            }
            // In-process writes cannot fail.
            if value == 1.0 {
                let _ = self.limiter.clear_multiplier(&subject, None).await;
                self.published.remove(&subject);
            } else {
                let _ = self
                    .limiter
                    .publish_multiplier(&subject, None, value, None)
                    .await;
                self.published.insert(subject, value);
            }
        }
    }

    /// This policy's verdict on `request` (None: invalid under it).
    async fn verdict(&self, request: &LimitRequest) -> Option<Verdict> {
        match self.limiter.verdict_now(request) {
            Some(verdict) => verdict.ok(),
            None => self.limiter.check(request).await.ok().map(|d| d.verdict()),
        }
    }

    fn request(&self, r: &Recorded) -> Option<LimitRequest> {
        Some(LimitRequest {
            method: r.method.clone(),
            endpoint: r.endpoint.clone(),
            ip: ClientIp::parse(&r.ip, self.ipv6_prefix_len)?,
            user: r
                .user
                .as_deref()
                .and_then(|u| SubjectKey::user(u, usize::MAX).ok()),
            device: r
                .device
                .as_deref()
                .and_then(|d| SubjectKey::device(d, usize::MAX).ok()),
            tenant: r
                .tenant
                .as_deref()
                .and_then(|t| SubjectKey::tenant(t, usize::MAX).ok()),
            recipient: None,
            cost: r.cost,
            consume: r.consume,
        })
    }
}

/// Both policies' answers to one recorded check, and the live limiter's.
#[derive(Debug, Clone)]
pub struct Step {
    /// What the live limiter answered when the check was made (None: not recorded).
    pub recorded: Option<Outcome>,
    /// Whether the engine had flagged the check's client when it was made: a multiplier
    /// below 1 on one of its subjects, or a challenge (see [`Recorded::flagged`]).
    pub flagged: bool,
    /// The live policy's verdict (None: the check was invalid under it, e.g. a cost above
    /// every capacity).
    pub live: Option<Verdict>,
    /// The candidate's.
    pub candidate: Option<Verdict>,
}

/// Runs recorded checks, in order, through both policies.
pub struct Replayer {
    clock: ManualClock,
    start_ms: i64,
    live: Side,
    candidate: Side,
    signals: Signals,
}

impl Replayer {
    /// Both policies' limiters with empty buckets, time standing at `start_ms`, recorded
    /// multipliers replayed.
    pub fn new(live: &LimitSettings, candidate: &LimitSettings, start_ms: i64) -> Self {
        Self::with_signals(live, candidate, start_ms, Signals::Recorded)
    }

    /// As [`Self::new`], scoring modelled as `signals` says.
    pub fn with_signals(
        live: &LimitSettings,
        candidate: &LimitSettings,
        start_ms: i64,
        signals: Signals,
    ) -> Self {
        let clock = ManualClock::new(start_ms);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        Self {
            live: Side::new(live, shared.clone()),
            candidate: Side::new(candidate, shared),
            clock,
            start_ms,
            signals,
        }
    }

    /// Moves time to `r`'s and asks both policies.
    pub async fn step(&mut self, r: &Recorded) -> Step {
        let now = self.clock.now_ms();
        if r.at_ms > now {
            let by = u64::try_from(r.at_ms - now).unwrap_or(0);
            self.clock.advance(Duration::from_millis(by));
        }
        debug_assert!(self.clock.now_ms() >= self.start_ms);
        // One request for both sides when they key IPv6 clients alike (the usual case).
        let live_request = self.live.request(r);
        let candidate_request = if self.candidate.ipv6_prefix_len == self.live.ipv6_prefix_len {
            None
        } else {
            Some(self.candidate.request(r))
        };
        let held = match self.signals {
            Signals::Recorded => r.multipliers,
            Signals::One => Multipliers::default(),
        };
        let live = match &live_request {
            Some(request) => {
                self.live.hold(request, &held).await;
                self.live.verdict(request).await
            }
            None => None,
        };
        let candidate = match candidate_request.as_ref().unwrap_or(&live_request) {
            Some(request) => {
                self.candidate.hold(request, &held).await;
                self.candidate.verdict(request).await
            }
            None => None,
        };
        Step {
            recorded: r.outcome,
            flagged: r.flagged(),
            live,
            candidate,
        }
    }
}

/// What changes for one class (or one scope of it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Checks.
    pub requests: u64,
    /// Refused by the live policy.
    pub refused_live: u64,
    /// Refused by the candidate.
    pub refused_candidate: u64,
    /// Allowed live, refused by the candidate.
    pub newly_refused: u64,
    /// Refused live, allowed by the candidate.
    pub newly_allowed: u64,
    /// Checks whose live answer was recorded.
    pub recorded: u64,
    /// Of those, refused by the live limiter when they were made.
    pub refused_recorded: u64,
    /// Of those, refused by the replay of the live policy.
    pub refused_replayed: u64,
    /// Of those, the replay of the live policy answered otherwise.
    pub mispredicted: u64,
    /// Checks of clients the engine had flagged; the rest are the honest population.
    pub flagged: u64,
    /// Flagged checks refused by the live policy.
    pub flagged_refused_live: u64,
    /// Flagged checks refused by the candidate.
    pub flagged_refused_candidate: u64,
}

impl Change {
    /// How far the replay's refusals of the live policy are from the live limiter's, as a
    /// share of the recorded checks (0 when none were recorded).
    pub fn prediction_error(&self) -> f64 {
        if self.recorded == 0 {
            return 0.0;
        }
        let replayed = self.refused_replayed as f64;
        (replayed - self.refused_recorded as f64).abs() / self.recorded as f64
    }

    /// Honest checks (not flagged) refused by the live policy and by the candidate.
    pub fn honest_refused(&self) -> (u64, u64) {
        (
            self.refused_live - self.flagged_refused_live,
            self.refused_candidate - self.flagged_refused_candidate,
        )
    }

    /// Honest checks.
    pub fn honest(&self) -> u64 {
        self.requests - self.flagged
    }
}

/// The difference between two policies on recorded traffic.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Checks replayed.
    pub requests: u64,
    /// Checks whose class differs between the policies.
    pub reclassified: u64,
    /// Per class (the candidate's class of each check).
    pub classes: BTreeMap<String, Change>,
    /// Per class and deciding scope of the policy that refused (`class/scope`).
    pub scopes: BTreeMap<String, Change>,
    /// The keys whose answers change most (deciding key of the refusing side), most first.
    pub top_keys: Vec<KeyChange>,
    /// Decisions per second the replay made (both policies counted).
    pub decisions_per_s: f64,
    /// How scoring was modelled.
    pub signals: Signals,
    /// Why the window may hold no checks (set when it held none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty: Option<String>,
    #[serde(skip)]
    keys: BTreeMap<String, (u64, u64)>,
    #[serde(skip)]
    scope_name: String,
}

/// One key's changed answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyChange {
    /// The subject key (pseudonymous as recorded).
    pub key: String,
    /// Checks the candidate refuses that the live policy allowed.
    pub newly_refused: u64,
    /// Checks the candidate allows that the live policy refused.
    pub newly_allowed: u64,
}

fn refused(verdict: Option<&Verdict>) -> bool {
    verdict.is_some_and(|v| !v.allowed)
}

/// The entry of `key`, made only the first time (a lookup by `&str` otherwise).
fn entry<'m, V: Default>(map: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

impl Report {
    /// Counts one step.
    pub fn add(&mut self, step: &Step) {
        self.requests += 1;
        let (live, candidate) = (step.live.as_ref(), step.candidate.as_ref());
        let class: &str = candidate.or(live).map_or("invalid", |d| &d.class);
        if let (Some(l), Some(c)) = (live, candidate)
            && l.class != c.class
        {
            self.reclassified += 1;
        }
        let (was, is) = (refused(live), refused(candidate));
        let recorded = step.recorded.map(|o| o == Outcome::Refused);
        let count = |change: &mut Change| {
            change.requests += 1;
            change.refused_live += u64::from(was);
            change.refused_candidate += u64::from(is);
            change.newly_refused += u64::from(is && !was);
            change.newly_allowed += u64::from(was && !is);
            if step.flagged {
                change.flagged += 1;
                change.flagged_refused_live += u64::from(was);
                change.flagged_refused_candidate += u64::from(is);
            }
            if let Some(refused) = recorded {
                change.recorded += 1;
                change.refused_recorded += u64::from(refused);
                change.refused_replayed += u64::from(was);
                change.mispredicted += u64::from(was != refused);
            }
        };
        count(entry(&mut self.classes, class));
        // The deciding scope of the side that refused (the candidate's when both did).
        let decider = if is { candidate } else { live };
        let deciding = decider.and_then(|v| v.deciding.as_ref());
        let scope = deciding.map_or("none", |(scope, _)| scope.as_str());
        self.scope_name.clear();
        self.scope_name.push_str(class);
        self.scope_name.push('/');
        self.scope_name.push_str(scope);
        count(entry(&mut self.scopes, &self.scope_name));
        if was != is
            && let Some((_, subject)) = deciding
        {
            let entry = entry(&mut self.keys, subject);
            if is {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }

    /// Fills `top_keys` (the `n` most changed) and the speed.
    pub fn finish(&mut self, n: usize, elapsed: Duration) {
        let mut keys: Vec<KeyChange> = std::mem::take(&mut self.keys)
            .into_iter()
            .map(|(key, (newly_refused, newly_allowed))| KeyChange {
                key,
                newly_refused,
                newly_allowed,
            })
            .collect();
        keys.sort_by(|a, b| {
            (b.newly_refused + b.newly_allowed)
                .cmp(&(a.newly_refused + a.newly_allowed))
                .then_with(|| a.key.cmp(&b.key))
        });
        keys.truncate(n);
        self.top_keys = keys;
        let secs = elapsed.as_secs_f64();
        self.decisions_per_s = if secs > 0.0 {
            (self.requests * 2) as f64 / secs
        } else {
            0.0
        };
        // Scopes without a change are noise in the report.
        self.scopes
            .retain(|_, c| c.newly_refused > 0 || c.newly_allowed > 0);
    }

    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        if let Some(why) = &self.empty {
            return format!("Replayed no checks: {why}\n");
        }
        let signals = match self.signals {
            Signals::Recorded => "multipliers as recorded",
            Signals::One => "multipliers held at 1",
        };
        let mut out = format!(
            "Replayed {} checks ({} reclassified, {signals}), {:.0} decisions/s.\n\n",
            self.requests, self.reclassified, self.decisions_per_s
        );
        out.push_str("| class | checks | refused live | refused candidate | newly refused | newly allowed | live refused when recorded | prediction error |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for (class, c) in &self.classes {
            let recorded = if c.recorded == 0 {
                ("–".to_owned(), "–".to_owned())
            } else {
                (
                    format!("{} of {}", c.refused_recorded, c.recorded),
                    format!("{:.2} %", 100.0 * c.prediction_error()),
                )
            };
            out.push_str(&format!(
                "| {class} | {} | {} | {} | {} | {} | {} | {} |\n",
                c.requests,
                c.refused_live,
                c.refused_candidate,
                c.newly_refused,
                c.newly_allowed,
                recorded.0,
                recorded.1
            ));
        }
        if !self.scopes.is_empty() {
            out.push_str("\n| class/scope | newly refused | newly allowed |\n|---|---:|---:|\n");
            for (scope, c) in &self.scopes {
                out.push_str(&format!(
                    "| {scope} | {} | {} |\n",
                    c.newly_refused, c.newly_allowed
                ));
            }
        }
        if !self.top_keys.is_empty() {
            out.push_str("\n| key | newly refused | newly allowed |\n|---|---:|---:|\n");
            for k in &self.top_keys {
                out.push_str(&format!(
                    "| {} | {} | {} |\n",
                    k.key, k.newly_refused, k.newly_allowed
                ));
            }
        }
        out
    }
}

/// A stretch of the traffic record.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// From, Unix ms.
    pub from_ms: i64,
    /// Before, Unix ms.
    pub to_ms: i64,
    /// Checks replayed at most.
    pub max: usize,
}

/// Whether one of `r`'s subjects is among `keys` (as the suggestion keys them: an address, a
/// pseudonym, or `device@address`).
fn among(keys: &HashSet<String>, r: &Recorded) -> bool {
    let named = [
        Some(&r.ip),
        r.user.as_ref(),
        r.device.as_ref(),
        r.tenant.as_ref(),
    ];
    named.into_iter().flatten().any(|k| keys.contains(k))
        || r.device
            .as_ref()
            .is_some_and(|d| keys.contains(&format!("{d}@{}", r.ip)))
}

/// Replays the record's checks in `window`, page by page in the order they were decided.
///
/// `progress` sees the report so far and the time reached after each page. A check counts
/// as flagged when its record says so ([`Recorded::flagged`]), or, given `flagged_keys`,
/// when it was challenged or one of its subjects is among them.
pub async fn replay_window(
    durable: &Durable,
    (live, candidate): (&LimitSettings, &LimitSettings),
    window: Window,
    signals: Signals,
    flagged_keys: Option<&HashSet<String>>,
    mut progress: impl FnMut(&Report, i64),
) -> Result<Report, Error> {
    let started = std::time::Instant::now();
    let mut report = Report {
        signals,
        ..Report::default()
    };
    let mut replayer: Option<Replayer> = None;
    let mut after: Option<(i64, String)> = None;
    let mut seen = 0usize;
    while seen < window.max {
        let page = read(
            durable,
            window.from_ms,
            window.to_ms,
            after.as_ref(),
            20_000,
        )
        .await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some((last.at_ms, last.id.clone()));
        let replayer = replayer
            .get_or_insert_with(|| Replayer::with_signals(live, candidate, page[0].at_ms, signals));
        for record in page.iter().take(window.max - seen) {
            let mut step = replayer.step(record).await;
            if let Some(keys) = flagged_keys {
                step.flagged = record.outcome == Some(Outcome::Challenged) || among(keys, record);
            }
            report.add(&step);
        }
        seen += page.len();
        progress(&report, last.at_ms);
    }
    report.finish(10, started.elapsed());
    Ok(report)
}

/// Replays `records` (in the order given) and reports; `each` sees every step.
pub async fn replay(
    live: &LimitSettings,
    candidate: &LimitSettings,
    records: impl IntoIterator<Item = Recorded>,
    signals: Signals,
    mut each: impl FnMut(&Recorded, &Step),
) -> Report {
    let started = std::time::Instant::now();
    let mut records = records.into_iter().peekable();
    let start = records.peek().map_or(0, |r| r.at_ms);
    let mut replayer = Replayer::with_signals(live, candidate, start, signals);
    let mut report = Report {
        signals,
        ..Report::default()
    };
    for record in records {
        let step = replayer.step(&record).await;
        report.add(&step);
        each(&record, &step);
    }
    report.finish(10, started.elapsed());
    report
}
