//! Reading multipliers: a subject's stored factors with the pull signals' (cached for one
//! L1 TTL), explained per class for `/v1/multipliers`, and the defaults the limiter passes to
//! the bucket script for subjects with nothing published.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::factor::{Combined, Factor, combine};

use super::{Engine, Error, KeyMultiplier, Subject, factor, lock};
use crate::model::SubjectKey;

use smallvec::SmallVec;

/// A subject as read for explanations: its stored factors and, per class index, what they
/// combine to with the pull signals (filled on first use), valid until `until_us`.
#[derive(Debug)]
pub(super) struct Cached {
    until_us: u64,
    stored: Arc<Vec<Factor>>,
    combined: Mutex<Vec<Option<Arc<Combined>>>>,
}

impl Engine {
    /// `subject`'s stored factors, reused for up to one L1 TTL.
    pub async fn stored(&self, subject: &SubjectKey) -> Result<Arc<Vec<Factor>>, Error> {
        Ok(self.cached(subject).await?.stored.clone())
    }

    pub(super) async fn cached(&self, subject: &SubjectKey) -> Result<Arc<Cached>, Error> {
        let now_us = self.clock.monotonic_us();
        if let Some(cached) = self.l1.get(subject.as_str())
            && cached.until_us > now_us
        {
            return Ok(cached);
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
            self.l1.insert(subject.as_str().to_owned(), cached.clone());
        }
        Ok(cached)
    }

    /// Forgets every cached explanation (a pull signal's data changed: lists, reputation).
    pub fn invalidate(&self) {
        self.l1.clear();
        self.next_generation();
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
    pub(super) fn default_for(&self, subject: &Subject<'_>, class: &str, now_ms: i64) -> f64 {
        let signals = self.signals.load();
        let parts: SmallVec<[Cow<'_, [Factor]>; 4]> = signals
            .iter()
            .map(|signal| signal.defaults(subject, now_ms))
            .filter(|part| !part.is_empty())
            .collect();
        if parts.is_empty() {
            return 1.0;
        }
        factor::multiplier_of(
            parts.iter().flat_map(|part| part.iter()),
            class,
            &self.policy,
            now_ms,
        )
    }

    pub(super) fn pull(
        &self,
        subject: &Subject<'_>,
        stored: &[Factor],
        now_ms: i64,
    ) -> Vec<Factor> {
        let signals = self.signals.load();
        let mut factors = Vec::new();
        for signal in signals.iter() {
            factors.extend(signal.factors(subject, stored, now_ms));
        }
        factors
    }

    pub(super) fn subject_of<'a>(key: &'a SubjectKey) -> Subject<'a> {
        Subject {
            key,
            ip: key.ip_addr(),
        }
    }
}

/// Most `/v1/multipliers` answers kept (the least used go first).
const EXPLANATIONS_CAPACITY: usize = 100_000;

/// Rendered `/v1/multipliers` answers by query, reused for one L1 TTL while the scoring
/// engine's generation stands (a publish or a list change moves it on).
///
/// Held by the app for the HTTP edge, which renders and reads them; the engine only says
/// when an answer may be out of date. A bounded concurrent cache (`quick_cache`): readers
/// of different queries do not wait on one lock, and a full cache evicts, never clears.
#[derive(Debug)]
pub struct Explanations(
    /// Query → (generation, until µs, body).
    quick_cache::sync::Cache<String, (u64, u64, bytes::Bytes)>,
);

impl Default for Explanations {
    fn default() -> Self {
        Self(quick_cache::sync::Cache::new(EXPLANATIONS_CAPACITY))
    }
}

impl Explanations {
    /// The answer to `query` rendered at `generation`, while it lasts.
    pub fn get(&self, query: &str, generation: u64, now_us: u64) -> Option<bytes::Bytes> {
        self.0
            .get(query)
            .filter(|(made, until, _)| *made == generation && *until > now_us)
            .map(|(_, _, body)| body)
    }

    /// Keeps the answer to `query` rendered at `generation` until `until_us`.
    pub fn put(&self, query: &str, generation: u64, until_us: u64, body: bytes::Bytes) {
        self.0
            .insert(query.to_owned(), (generation, until_us, body));
    }
}
