//! Scoring: where signals meet. Factors with reasons in, one multiplier per key and class out,
//! published where the token-bucket script reads it.
//!
//! Read [`factor::combine`] first (pure: the combination policy), then [`Engine::apply`].
//! Two ways in: *push* signals (lockouts, spraying, attestation verdicts, anomalies, repeat
//! offenders) store factors with [`Engine::assert`] / [`Engine::retract`]; *pull* signals
//! (reputation, manual lists, attestation's default) implement [`Signal`] and are asked
//! whenever a subject is scored, from in-process state. A subject with stored factors gets
//! its combined multiplier per class published ([`store`]); every other subject is judged by
//! the pull signals alone, computed per check and passed to the bucket script as its default
//! ([`Engine`] implements [`crate::limiter::DefaultMultipliers`]). Scoring never imports a
//! concrete signal: `app` registers them.

pub mod alerts;
mod baseline;
pub mod factor;
mod offenders;
pub mod store;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;

pub use alerts::{Alert, Alerts};
pub use baseline::Anomaly;
pub use factor::{Combined, Contribution, Effect, Factor, Policy, combine, combine_multiplier};
pub use store::{Change, DecisionChange};

use crate::clock::Clock;
use crate::config::Settings;
use crate::limiter::{Decision, DefaultMultipliers, Defaults, LimitRequest};
use crate::model::SubjectKey;
use crate::store::{Hot, Keys, Stores};
use crate::telemetry::metrics as names;
use baseline::Baselines;
use offenders::SpaceSaving;
use store::{FactorStore, Record, Update, Updated, Write};

/// Stored factors read for explanations are reused for at most this long (`/v1/multipliers`
/// L1); also bounded by `limits.l1_ttl_ms`.
const MAX_L1_TTL_US: u64 = 1_000_000;
/// Most subjects held in that L1.
const L1_CAPACITY: usize = 100_000;
/// Most subjects in a decision snapshot.
pub const SNAPSHOT_LIMIT: usize = 10_000;
/// Shared offender totals are kept for this many minutes.
const OFFENDER_MINUTES: i64 = 60;

/// A subject as pull signals see it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Its key.
    pub key: &'a SubjectKey,
    /// The client address, for `ip:` subjects.
    pub ip: Option<IpAddr>,
}

/// A pull signal: factors derived on demand from in-process state (it must be cheap: it runs
/// for every limit check of a subject that has nothing published).
pub trait Signal: Send + Sync + fmt::Debug {
    /// Stable name, as in [`Factor::signal`].
    fn name(&self) -> &'static str;
    /// The factors this signal gives `subject` at `now_ms`; `stored` are the subject's
    /// stored factors (a signal may step back when a push signal already spoke).
    fn factors(&self, subject: &Subject<'_>, stored: &[Factor], now_ms: i64) -> Vec<Factor>;
}

/// Why scoring failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// One key's multiplier for one class, with every contribution.
#[derive(Debug, Clone)]
pub struct KeyMultiplier {
    /// The key.
    pub key: SubjectKey,
    /// Its combination.
    pub combined: Arc<Combined>,
}

/// A key that keeps hitting 429.
#[derive(Debug, Clone, PartialEq)]
pub struct Offender {
    /// The key.
    pub key: String,
    /// 429s in the window (over every instance).
    pub count: u64,
    /// Unix ms until which it is tightened as a repeat offender, if it is.
    pub tightened_until_ms: Option<i64>,
}

/// Called after every publish (wired to the limiter's L1 reset).
struct Hook(Box<dyn Fn() + Send + Sync>);

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hook")
    }
}

/// The scoring engine of one instance.
#[derive(Debug)]
pub struct Engine {
    policy: Policy,
    classes: Vec<String>,
    public_classes: Vec<String>,
    settings: crate::config::ScoringSettings,
    keys: Keys,
    hot: Hot,
    store: FactorStore,
    clock: Arc<dyn Clock>,
    signals: ArcSwap<Vec<Arc<dyn Signal>>>,
    on_publish: OnceLock<Hook>,
    l1_ttl_us: u64,
    /// Subject → what explanations read of it. std Mutex: never held across `.await`.
    l1: Mutex<HashMap<String, Arc<Cached>>>,
    /// Rendered explanations by the caller's key (the query), for one L1 TTL; cleared by
    /// every publish of this instance.
    answers: Mutex<HashMap<String, (u64, bytes::Bytes)>>,
    baselines: Baselines,
    key_hasher: foldhash::fast::RandomState,
    sketch: Mutex<SpaceSaving>,
    /// In-process shared offender totals (embedded mode): minute → key → count.
    offender_totals: Mutex<BTreeMap<i64, HashMap<String, u64>>>,
    alerts: Alerts,
}

/// What one publish of a subject writes and records.
struct Plan {
    /// Per class: its multiplier key and the value to write (None: delete).
    writes: Vec<Write>,
    /// The keys' expiry: with the last stored factor (None: never).
    ttl_ms: Option<u64>,
    /// Per class, the multiplier in force (empty: nothing stored).
    published: BTreeMap<String, f64>,
    reasons: BTreeSet<String>,
    /// When the last stored factor expires (None: one never does).
    last: Option<i64>,
    /// The next expiry before `last`, when the multipliers change by themselves.
    next_change: Option<i64>,
}

/// A subject as read for explanations: its stored factors and, per class index, what they
/// combine to with the pull signals (filled on first use), valid until `until_us`.
#[derive(Debug)]
struct Cached {
    until_us: u64,
    stored: Arc<Vec<Factor>>,
    combined: Mutex<Vec<Option<Arc<Combined>>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Engine {
    /// The engine of one instance; register the pull signals with [`Engine::register`].
    pub fn new(settings: &Settings, stores: &Stores, clock: Arc<dyn Clock>) -> Self {
        let scoring = settings.scoring.clone();
        let classes: Vec<String> = settings.limits.classes.keys().cloned().collect();
        Self {
            policy: Policy::from_settings(&scoring, classes.iter().map(String::as_str)),
            public_classes: scoring.public_classes.clone(),
            classes,
            keys: stores.keys.clone(),
            hot: stores.hot.clone(),
            store: FactorStore::new(&stores.hot),
            signals: ArcSwap::from_pointee(Vec::new()),
            on_publish: OnceLock::new(),
            l1_ttl_us: (settings.limits.l1_ttl_ms * 1000).min(MAX_L1_TTL_US),
            l1: Mutex::new(HashMap::new()),
            answers: Mutex::new(HashMap::new()),
            baselines: Baselines::new(&scoring.anomaly),
            key_hasher: foldhash::fast::RandomState::default(),
            sketch: Mutex::new(SpaceSaving::new(scoring.offenders.sketch_capacity)),
            offender_totals: Mutex::new(BTreeMap::new()),
            alerts: Alerts::new(
                stores.durable.clone(),
                stores.hot.clone(),
                stores.keys.clone(),
                clock.clone(),
                scoring.webhooks.clone(),
            ),
            settings: scoring,
            clock,
        }
    }

    /// Installs the pull signals (replacing any before).
    pub fn register(&self, signals: Vec<Arc<dyn Signal>>) {
        self.signals.store(Arc::new(signals));
    }

    /// Runs `hook` after every publish (once; later calls are ignored).
    pub fn on_publish(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_publish.set(Hook(Box::new(hook)));
    }

    /// Endpoint classes multipliers are published for.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Classes reachable without an account (`scoring.public_classes`).
    pub fn public_classes(&self) -> &[String] {
        &self.public_classes
    }

    /// The combination policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The alerts service.
    pub fn alerts(&self) -> &Alerts {
        &self.alerts
    }

    /// Keys tracked by the anomaly baselines, the most they can hold, and their bytes (fixed
    /// at start).
    pub fn baseline_keys(&self) -> (usize, usize, usize) {
        (
            self.baselines.tracked(),
            self.baselines.capacity(),
            self.baselines.bytes(),
        )
    }

    /// Stores (or replaces) `factor` for `subject` and publishes the result.
    pub async fn assert(&self, subject: &SubjectKey, factor: Factor) -> Result<(), Error> {
        self.apply(subject, &[Change::Set(factor)]).await
    }

    /// Removes the factors with these ids (`signal:code`) and publishes the result.
    pub async fn retract(&self, subject: &SubjectKey, ids: &[&str]) -> Result<(), Error> {
        let changes: Vec<Change> = ids
            .iter()
            .map(|id| Change::Delete((*id).to_owned()))
            .collect();
        self.apply(subject, &changes).await
    }

    /// Publishes `subject` again (a pull signal changed, or a stored factor expired).
    pub async fn rescore(&self, subject: &SubjectKey) -> Result<(), Error> {
        self.apply(subject, &[]).await
    }

    /// Applies changes to `subject`'s stored factors and publishes its multipliers.
    ///
    /// Concurrent callers may finish in any order: each publishes the view of the version it
    /// made, and a publish of an older version is refused by the store, so what is published
    /// last always reflects the latest factors.
    pub async fn apply(&self, subject: &SubjectKey, changes: &[Change]) -> Result<(), Error> {
        self.apply_many(&[(subject, changes)]).await
    }

    /// Stores (or replaces) a factor for each subject (distinct subjects) and publishes them,
    /// as [`Engine::assert`] on each would, in a few calls: the factors are stored, and
    /// those of subjects with nothing stored before published, in one script call per
    /// 32 subjects, the bookkeeping in one pipeline. A batch of challenges took two round
    /// trips each.
    pub async fn assert_many(&self, asserts: Vec<(&SubjectKey, Factor)>) -> Result<(), Error> {
        let changes: Vec<(&SubjectKey, [Change; 1])> = asserts
            .into_iter()
            .map(|(subject, factor)| (subject, [Change::Set(factor)]))
            .collect();
        let items: Vec<(&SubjectKey, &[Change])> = changes
            .iter()
            .map(|(subject, change)| (*subject, &change[..]))
            .collect();
        self.apply_many(&items).await
    }

    /// [`Engine::apply`] on each of distinct subjects, together.
    async fn apply_many(&self, items: &[(&SubjectKey, &[Change])]) -> Result<(), Error> {
        if items.is_empty() {
            return Ok(());
        }
        // Counted per distinct (signal, code, mode) of the call: a wave of challenges is
        // hundreds of the same factor, and each labelled increment is a registry lookup.
        let mut counted: Vec<(&str, &str, &'static str, u64)> = Vec::new();
        for (_, changes) in items {
            for change in *changes {
                if let Change::Set(factor) = change {
                    let mode = if self.policy.is_shadow(factor) {
                        "shadow"
                    } else {
                        "enforced"
                    };
                    let labels = (factor.signal.as_str(), factor.code.as_str(), mode);
                    match counted.iter_mut().find(|c| (c.0, c.1, c.2) == labels) {
                        Some(count) => count.3 += 1,
                        None => counted.push((labels.0, labels.1, labels.2, 1)),
                    }
                }
            }
        }
        for (signal, code, mode, n) in counted {
            metrics::counter!(names::SCORING_FACTORS_TOTAL, "signal" => signal.to_owned(), "code" => code.to_owned(), "mode" => mode)
                .increment(n);
        }
        let now = self.clock.now_ms();
        // Per subject: what a reader answers for a class with nothing published (the pull
        // factors alone), and the plan for a subject with nothing stored before (its factors
        // its changes' sets), which the store writes in the same call when that is so.
        let mut defaults = Vec::with_capacity(items.len());
        let mut fresh = Vec::with_capacity(items.len());
        for (subject, changes) in items {
            let pulled = self.pull(&Self::subject_of(subject), &[], now);
            let mut sets: BTreeMap<String, &Factor> = BTreeMap::new();
            for change in *changes {
                match change {
                    Change::Set(factor) => sets.insert(factor.id(), factor),
                    Change::Delete(id) => sets.remove(id),
                };
            }
            let sets: Vec<Factor> = sets
                .into_values()
                .filter(|f| !f.has_expired(now))
                .cloned()
                .collect();
            fresh.push(self.plan(subject, &sets, &pulled, now));
            defaults.push(pulled);
        }
        let updates: Vec<Update<'_>> = items
            .iter()
            .zip(&fresh)
            .map(|((subject, changes), plan)| Update {
                subject,
                changes,
                fresh: (&plan.writes, plan.ttl_ms),
            })
            .collect();
        let updated = self.store.update(&self.keys, now, &updates).await?;
        // Subjects that had nothing stored were published by the update, as planned; those
        // that had factors are published one by one, at once (each checks its version). Only
        // the latter are futures (a wave of challenges is hundreds of the former, which need
        // no future of their own); the fresh plan of a subject that had factors is replaced.
        let mut published: Vec<(Plan, bool)> = fresh.into_iter().map(|p| (p, true)).collect();
        let stored_before =
            updated
                .into_iter()
                .enumerate()
                .filter_map(|(i, updated)| match updated {
                    Updated::Published => None,
                    Updated::Stored(stored) => Some((i, stored)),
                });
        let publishes = stored_before.map(|(i, stored)| {
            let (subject, defaults) = (items[i].0, &defaults[i]);
            async move {
                let plan = self.plan(subject, &stored.factors, defaults, now);
                let written = self
                    .store
                    .publish(
                        &self.keys,
                        subject,
                        stored.version,
                        &plan.writes,
                        plan.ttl_ms,
                        self.clock.monotonic_us(),
                    )
                    .await?;
                Ok::<_, Error>((i, plan, written))
            }
        });
        for outcome in futures_util::future::join_all(publishes).await {
            let (i, plan, written) = outcome?;
            published[i] = (plan, written);
        }
        self.published(items, published, now).await
    }

    fn pull(&self, subject: &Subject<'_>, stored: &[Factor], now_ms: i64) -> Vec<Factor> {
        let signals = self.signals.load();
        let mut factors = Vec::new();
        for signal in signals.iter() {
            factors.extend(signal.factors(subject, stored, now_ms));
        }
        factors
    }

    fn subject_of<'a>(key: &'a SubjectKey) -> Subject<'a> {
        Subject {
            key,
            ip: key.ip_addr(),
        }
    }

    /// What publishing `subject` with these stored factors writes; `defaults` are its pull
    /// factors with nothing stored (what readers answer for a class with nothing published).
    fn plan(&self, subject: &SubjectKey, stored: &[Factor], defaults: &[Factor], now: i64) -> Plan {
        let mut all = stored.to_vec();
        if stored.is_empty() {
            all.extend_from_slice(defaults);
        } else {
            all.extend(self.pull(&Self::subject_of(subject), stored, now));
        }
        let mut writes = Vec::with_capacity(self.classes.len());
        let mut published = BTreeMap::new();
        let mut reasons = BTreeSet::new();
        // A class no stored factor applies to, whose multiplier is that default, is not
        // written (its key is deleted): readers answer their default, as for any subject with
        // nothing published. A class a stored factor applies to is always written, so a stored
        // change (a list entry naming the subject, say) holds on every instance at once, even
        // one whose list refresh is behind (up to 500 ms). A challenge (a factor on `auth`
        // only) wrote a key for every class, and those SETs into a keyspace of millions were
        // the largest part of Redis's time per challenge in a wave of them.
        for class in &self.classes {
            let key = self.keys.multiplier(subject, class);
            if stored.is_empty() {
                writes.push((key, None));
                continue;
            }
            let (multiplier, codes) = combine_multiplier(&all, class, &self.policy, now);
            for code in codes {
                if !reasons.contains(code) {
                    reasons.insert(code.to_owned());
                }
            }
            published.insert(class.clone(), multiplier);
            let written = stored.iter().any(|f| f.applies_to(class))
                || multiplier != combine_multiplier(defaults, class, &self.policy, now).0;
            writes.push((key, written.then_some(multiplier)));
        }
        // The keys fade with the last stored factor; intermediate changes are republished
        // from the due set.
        let expiries: Vec<Option<i64>> = stored.iter().map(|f| f.expires_at_ms).collect();
        let last = if expiries.iter().any(Option::is_none) {
            None
        } else {
            expiries.iter().flatten().max().copied()
        };
        let ttl_ms = last.map(|at| u64::try_from((at - now).max(1)).unwrap_or(1));
        let next_change = expiries
            .iter()
            .flatten()
            .copied()
            .filter(|&at| at > now && Some(at) != last)
            .min();
        Plan {
            writes,
            ttl_ms,
            published,
            reasons,
            last,
            next_change,
        }
    }

    /// After publishes (`written`: false if a newer change superseded it): forgets this
    /// instance's cached views and records the changes (active index, due set, stream).
    async fn published(
        &self,
        items: &[(&SubjectKey, &[Change])],
        outcomes: Vec<(Plan, bool)>,
        now: i64,
    ) -> Result<(), Error> {
        let mut changes = Vec::with_capacity(items.len());
        {
            let mut l1 = lock(&self.l1);
            let superseded = outcomes.iter().filter(|(_, written)| !written).count() as u64;
            for (outcome, n) in [
                ("written", outcomes.len() as u64 - superseded),
                ("superseded", superseded),
            ] {
                if n > 0 {
                    metrics::counter!(names::MULTIPLIER_PUBLISHES_TOTAL, "outcome" => outcome)
                        .increment(n);
                }
            }
            for ((subject, _), (plan, written)) in items.iter().zip(outcomes) {
                l1.remove(subject.as_str());
                if !written {
                    continue;
                }
                let Plan {
                    published,
                    reasons,
                    last,
                    next_change,
                    ..
                } = plan;
                let active = (!published.is_empty()).then_some(last.unwrap_or(i64::MAX));
                let change = DecisionChange {
                    cursor: String::new(),
                    kind: "multiplier".to_owned(),
                    action: if published.is_empty() {
                        "delete"
                    } else {
                        "set"
                    }
                    .to_owned(),
                    subject: subject.to_string(),
                    classes: published,
                    expires_at_ms: last,
                    reasons: reasons.into_iter().collect(),
                    reference: None,
                    list: None,
                    at_ms: now,
                };
                changes.push((*subject, active, next_change, change));
            }
        }
        lock(&self.answers).clear();
        if changes.is_empty() {
            return Ok(());
        }
        let records: Vec<Record<'_>> = changes
            .iter()
            .map(|(subject, active, due_ms, change)| Record {
                subject,
                active: *active,
                due_ms: *due_ms,
                change,
            })
            .collect();
        self.store.record(&self.keys, &records).await?;
        if let Some(hook) = self.on_publish.get() {
            (hook.0)();
        }
        Ok(())
    }

    /// `subject`'s stored factors, reused for up to one L1 TTL.
    pub async fn stored(&self, subject: &SubjectKey) -> Result<Arc<Vec<Factor>>, Error> {
        Ok(self.cached(subject).await?.stored.clone())
    }

    async fn cached(&self, subject: &SubjectKey) -> Result<Arc<Cached>, Error> {
        let now_us = self.clock.monotonic_us();
        if let Some(cached) = lock(&self.l1).get(subject.as_str())
            && cached.until_us > now_us
        {
            return Ok(cached.clone());
        }
        let factors = Arc::new(
            self.store
                .read(&self.keys, subject, self.clock.now_ms())
                .await?,
        );
        let cached = Arc::new(Cached {
            until_us: now_us + self.l1_ttl_us,
            stored: factors,
            combined: Mutex::new(vec![None; self.classes.len()]),
        });
        if self.l1_ttl_us > 0 {
            let mut l1 = lock(&self.l1);
            if l1.len() >= L1_CAPACITY {
                l1.retain(|_, c| c.until_us > now_us);
                if l1.len() >= L1_CAPACITY {
                    l1.clear();
                }
            }
            l1.insert(subject.as_str().to_owned(), cached.clone());
        }
        Ok(cached)
    }

    /// Forgets every cached explanation (a pull signal's data changed: lists, reputation).
    pub fn invalidate(&self) {
        lock(&self.l1).clear();
        lock(&self.answers).clear();
    }

    /// An explanation rendered under `key` within the last L1 TTL, if any (and no publish of
    /// this instance happened since).
    pub fn answer(&self, key: &str) -> Option<bytes::Bytes> {
        let now_us = self.clock.monotonic_us();
        lock(&self.answers)
            .get(key)
            .filter(|(until, _)| *until > now_us)
            .map(|(_, body)| body.clone())
    }

    /// Keeps a rendered explanation for one L1 TTL (at most [`L1_CAPACITY`] of them).
    pub fn remember_answer(&self, key: &str, body: bytes::Bytes) {
        if self.l1_ttl_us == 0 {
            return;
        }
        let now_us = self.clock.monotonic_us();
        let mut answers = lock(&self.answers);
        if answers.len() >= L1_CAPACITY {
            answers.retain(|_, (until, _)| *until > now_us);
            if answers.len() >= L1_CAPACITY {
                answers.clear();
            }
        }
        answers.insert(key.to_owned(), (now_us + self.l1_ttl_us, body));
    }

    /// The multiplier of each subject for `class`, with every contribution (stored and
    /// pulled), as enforcement sees it. Reused for up to one L1 TTL.
    pub async fn explain(
        &self,
        class: &str,
        subjects: &[(SubjectKey, Option<IpAddr>)],
    ) -> Result<Vec<KeyMultiplier>, Error> {
        let now = self.clock.now_ms();
        let class_index = self.classes.iter().position(|c| c == class);
        let mut out = Vec::with_capacity(subjects.len());
        for (key, ip) in subjects {
            let cached = self.cached(key).await?;
            let hit = class_index.and_then(|i| lock(&cached.combined)[i].clone());
            let combined = match hit {
                Some(combined) => combined,
                None => {
                    let subject = Subject {
                        key,
                        ip: ip.or_else(|| key.ip_addr()),
                    };
                    let mut all: Vec<Factor> = cached.stored.as_ref().clone();
                    all.extend(self.pull(&subject, &cached.stored, now));
                    let combined = Arc::new(combine(&all, class, &self.policy, now));
                    if let Some(i) = class_index {
                        lock(&cached.combined)[i] = Some(combined.clone());
                    }
                    combined
                }
            };
            out.push(KeyMultiplier {
                key: key.clone(),
                combined,
            });
        }
        Ok(out)
    }

    /// The multiplier `subject` would have on `class` without the stored factors named in
    /// `without` (ids `signal:code`): what enforcement gives a context that a factor does not
    /// bind (the lockout-DoS rule lifts an account's lockout for its known contexts).
    pub async fn multiplier_without(
        &self,
        subject: &SubjectKey,
        class: &str,
        without: &[&str],
    ) -> Result<f64, Error> {
        let now = self.clock.now_ms();
        let cached = self.cached(subject).await?;
        let kept: Vec<Factor> = cached
            .stored
            .iter()
            .filter(|f| !without.iter().any(|id| f.signal_code_is(id)))
            .cloned()
            .collect();
        let mut all = kept.clone();
        all.extend(self.pull(&Self::subject_of(subject), &kept, now));
        Ok(combine(&all, class, &self.policy, now).multiplier)
    }

    /// The multiplier of a subject with nothing published: its pull factors alone.
    fn default_for(&self, subject: &Subject<'_>, class: &str, now_ms: i64) -> f64 {
        let factors = self.pull(subject, &[], now_ms);
        if factors.is_empty() {
            return 1.0;
        }
        combine(&factors, class, &self.policy, now_ms).multiplier
    }

    /// One step of the due loop: republishes the subjects whose multipliers change now (a
    /// shorter-lived factor expired while a longer one remains). Returns how many.
    pub async fn republish_due(&self) -> Result<usize, Error> {
        let subjects = self.store.take_due(&self.keys, self.clock.now_ms()).await?;
        for subject in &subjects {
            self.rescore(subject).await?;
        }
        Ok(subjects.len())
    }

    /// Appends a lockout or list change to the decision stream.
    pub async fn record_change(&self, change: DecisionChange) -> Result<(), Error> {
        self.record_changes(vec![change]).await
    }

    /// [`Engine::record_change`] for several changes, in order (one pipeline on Redis).
    pub async fn record_changes(&self, mut changes: Vec<DecisionChange>) -> Result<(), Error> {
        let now = self.clock.now_ms();
        for change in &mut changes {
            change.at_ms = now;
        }
        Ok(self.store.append_all(&self.keys, &changes).await?)
    }

    /// Stream entries after `cursor` (None: none, only the current cursor), the next cursor,
    /// and whether entries after `cursor` were trimmed (start again from a snapshot).
    pub async fn changes(
        &self,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<DecisionChange>, String, bool), Error> {
        Ok(self.store.changes(&self.keys, cursor, limit).await?)
    }

    /// The multipliers in force for every subject with published multipliers (at most
    /// [`SNAPSHOT_LIMIT`]), as stream entries.
    pub async fn snapshot(&self) -> Result<Vec<DecisionChange>, Error> {
        let now = self.clock.now_ms();
        let subjects = self.store.active(&self.keys, now, SNAPSHOT_LIMIT).await?;
        let mut out = Vec::with_capacity(subjects.len());
        for subject in subjects {
            let stored = self.store.read(&self.keys, &subject, now).await?;
            if stored.is_empty() {
                continue;
            }
            let view = Self::subject_of(&subject);
            let mut all = stored.clone();
            all.extend(self.pull(&view, &stored, now));
            let mut classes = BTreeMap::new();
            let mut reasons = BTreeSet::new();
            for class in &self.classes {
                let combined = combine(&all, class, &self.policy, now);
                classes.insert(class.clone(), combined.multiplier);
                reasons.extend(
                    combined
                        .contributions
                        .into_iter()
                        .filter(|c| !c.shadow)
                        .map(|c| c.code),
                );
            }
            let expires = if stored.iter().any(|f| f.expires_at_ms.is_none()) {
                None
            } else {
                stored.iter().filter_map(|f| f.expires_at_ms).max()
            };
            out.push(DecisionChange {
                cursor: String::new(),
                kind: "multiplier".to_owned(),
                action: "set".to_owned(),
                subject: subject.to_string(),
                classes,
                expires_at_ms: expires,
                reasons: reasons.into_iter().collect(),
                reference: None,
                list: None,
                at_ms: now,
            });
        }
        Ok(out)
    }

    fn key_hash(&self, key: &SubjectKey) -> u64 {
        self.key_hasher.hash_one(key.as_str())
    }

    /// Counts requests of `keys` in `minute` (Unix ms ÷ 60000) towards their baselines and,
    /// when `limited`, towards their 429s; returns the keys that became anomalous.
    pub fn observe(
        &self,
        keys: &[&SubjectKey],
        minute: u32,
        limited: bool,
    ) -> Vec<(SubjectKey, Anomaly)> {
        let mut anomalies = Vec::new();
        for key in keys {
            if let Some(anomaly) = self
                .baselines
                .observe(self.key_hash(key), key.kind(), minute, 1)
            {
                anomalies.push(((*key).clone(), anomaly));
            }
        }
        if limited {
            let mut sketch = lock(&self.sketch);
            for key in keys {
                sketch.offer(key.as_str(), 1);
            }
        }
        anomalies
    }

    /// Feeds one limit decision: the request's keys towards their baselines, and a denial
    /// towards the deciding key's 429s. Anomalies found are handled at once.
    pub async fn observe_check(
        &self,
        request: &LimitRequest,
        decision: &Decision,
    ) -> Result<(), Error> {
        let ip = SubjectKey::ip(&request.ip);
        let mut keys: Vec<&SubjectKey> = vec![&ip];
        keys.extend(request.user.as_ref());
        keys.extend(request.device.as_ref());
        let minute = minute_of(decision.now_ms);
        let anomalies = self.observe(&keys, minute, false);
        if !decision.allowed
            && let Some(scope) = decision.deciding_scope()
        {
            lock(&self.sketch).offer(&scope.subject, 1);
        }
        self.handle_anomalies(anomalies).await
    }

    /// Tightens anomalous keys for the cooling period and raises one alert each.
    pub async fn handle_anomalies(
        &self,
        anomalies: Vec<(SubjectKey, Anomaly)>,
    ) -> Result<(), Error> {
        let settings = &self.settings.anomaly;
        for (key, anomaly) in anomalies {
            let now = self.clock.now_ms();
            let cooling = Duration::from_secs(settings.cooling_s);
            let ratio = f64::from(anomaly.count) / anomaly.baseline;
            let against = if anomaly.class_baseline {
                format!("the {} baseline", key.kind().as_str())
            } else {
                "its own baseline".to_owned()
            };
            let message = format!(
                "{key} made {} requests this minute, {ratio:.0}x {against} of {:.1}/min",
                anomaly.count, anomaly.baseline
            );
            metrics::counter!(names::ANOMALIES_TOTAL, "kind" => key.kind().as_str()).increment(1);
            let alert = self
                .alerts
                .raise(
                    "anomaly",
                    &key,
                    message.clone(),
                    serde_json::json!({
                        "count": anomaly.count,
                        "baseline_per_min": anomaly.baseline,
                        "ratio": ratio,
                        "class_baseline": anomaly.class_baseline,
                    }),
                    Some(cooling),
                )
                .await?;
            let mut factor = Factor::scale("anomaly", "anomaly", settings.factor, message)
                .until(now + i64::try_from(cooling.as_millis()).unwrap_or(i64::MAX));
            if let Some(alert) = alert {
                factor = factor.referring_to(alert.id);
            }
            self.assert(&key, factor).await?;
        }
        Ok(())
    }

    /// One flush step: adds this instance's counted 429s to the shared per-minute totals and
    /// tightens the keys whose total passed `offenders.per_minute`. Returns how many keys
    /// became repeat offenders.
    pub async fn flush_offenders(&self) -> Result<usize, Error> {
        let counted = lock(&self.sketch).drain();
        if counted.is_empty() {
            return Ok(0);
        }
        let now = self.clock.now_ms();
        let minute = now / 60_000;
        // Guaranteed counts only: a sketch estimate never makes an offender.
        let deltas: Vec<(Arc<str>, u64)> = counted
            .into_iter()
            .filter_map(|(key, count, error)| (count > error).then_some((key, count - error)))
            .collect();
        let totals: Vec<u64> = match &self.hot {
            Hot::Memory(_) => {
                let mut all = lock(&self.offender_totals);
                all.retain(|m, _| *m > minute - OFFENDER_MINUTES);
                let this = all.entry(minute).or_default();
                deltas
                    .iter()
                    .map(|(key, delta)| {
                        let total = this.entry(key.to_string()).or_default();
                        *total += delta;
                        *total
                    })
                    .collect()
            }
            Hot::Redis(redis) => {
                let key = self.keys.scoring(&format!("offenders:{minute}"));
                let mut pipe = redis::pipe();
                for (subject, delta) in &deltas {
                    pipe.cmd("ZINCRBY").arg(&key).arg(*delta).arg(&**subject);
                }
                pipe.cmd("EXPIRE")
                    .arg(&key)
                    .arg(OFFENDER_MINUTES * 60)
                    .ignore()
                    .cmd("ZREMRANGEBYRANK")
                    .arg(&key)
                    .arg(0)
                    .arg(-(4096 + 1))
                    .ignore();
                let scores: Vec<f64> = redis.query_pipeline(&pipe).await.map_err(Error::Store)?;
                scores.into_iter().map(|s| s as u64).collect()
            }
        };
        let settings = &self.settings.offenders;
        let mut flagged = 0;
        for ((subject, _), total) in deltas.iter().zip(totals) {
            if total <= settings.per_minute {
                continue;
            }
            let Some(key) = SubjectKey::from_text(subject) else {
                continue;
            };
            let cooling = Duration::from_secs(settings.cooling_s);
            let message = format!(
                "{key} was refused {total} times this minute (repeat offender above {}/min)",
                settings.per_minute
            );
            let alert = self
                .alerts
                .raise(
                    "repeat_offender",
                    &key,
                    message.clone(),
                    serde_json::json!({ "count_this_minute": total, "threshold_per_min": settings.per_minute }),
                    Some(cooling),
                )
                .await?;
            // Once per cooling period: the alert marker decides.
            let Some(alert) = alert else { continue };
            flagged += 1;
            metrics::counter!(names::OFFENDERS_TOTAL, "kind" => key.kind().as_str()).increment(1);
            let until = now + i64::try_from(cooling.as_millis()).unwrap_or(i64::MAX);
            self.assert(
                &key,
                Factor::scale("offender", "repeat_offender", settings.factor, message)
                    .until(until)
                    .referring_to(alert.id),
            )
            .await?;
        }
        Ok(flagged)
    }

    /// The keys refused most often in the last `window_s` seconds (1..=3600), most first,
    /// over every instance (as of their last flush), at most `limit`.
    pub async fn offenders(&self, window_s: u64, limit: usize) -> Result<Vec<Offender>, Error> {
        let now = self.clock.now_ms();
        let window_min = i64::try_from(window_s.div_ceil(60).clamp(1, 60)).unwrap_or(1);
        let last = now / 60_000;
        let minutes: Vec<i64> = (last - window_min + 1..=last).collect();
        let mut counts: Vec<(String, u64)> = match &self.hot {
            Hot::Memory(_) => {
                let all = lock(&self.offender_totals);
                let mut merged: HashMap<String, u64> = HashMap::new();
                for minute in &minutes {
                    for (key, count) in all.get(minute).into_iter().flatten() {
                        *merged.entry(key.clone()).or_default() += count;
                    }
                }
                merged.into_iter().collect()
            }
            Hot::Redis(redis) => {
                let mut cmd = redis::cmd("ZUNION");
                cmd.arg(minutes.len());
                for minute in &minutes {
                    cmd.arg(self.keys.scoring(&format!("offenders:{minute}")));
                }
                cmd.arg("WITHSCORES");
                let merged: Vec<(String, f64)> = redis.query(&cmd).await?;
                merged.into_iter().map(|(k, s)| (k, s as u64)).collect()
            }
        };
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts.truncate(limit);
        let mut out = Vec::with_capacity(counts.len());
        for (key, count) in counts {
            let tightened_until_ms = match SubjectKey::from_text(&key) {
                Some(subject) => self
                    .stored(&subject)
                    .await?
                    .iter()
                    .find(|f| f.signal == "offender")
                    .and_then(|f| f.expires_at_ms),
                None => None,
            };
            out.push(Offender {
                key,
                count,
                tightened_until_ms,
            });
        }
        Ok(out)
    }
}

/// Unix ms → minute number.
pub fn minute_of(ms: i64) -> u32 {
    u32::try_from(ms.max(0) / 60_000).unwrap_or(u32::MAX)
}

impl DefaultMultipliers for Engine {
    fn defaults(&self, class: &str, request: &LimitRequest) -> Defaults {
        let now = self.clock.now_ms();
        let ip = SubjectKey::ip(&request.ip);
        let of = |key: &SubjectKey, ip: Option<IpAddr>| {
            self.default_for(&Subject { key, ip }, class, now)
        };
        Defaults {
            ip: of(&ip, Some(request.ip.addr())),
            user: request.user.as_ref().map_or(1.0, |u| of(u, None)),
            device: request.device.as_ref().map_or(1.0, |d| of(d, None)),
        }
    }
}
