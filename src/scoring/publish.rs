//! Publishing: a subject's stored factors change (asserted, retracted, applied), and its
//! combined multiplier per class is written where the bucket script reads it, version-checked
//! so an older combination never overwrites a newer one.

use std::collections::{BTreeMap, BTreeSet};

use super::factor::{Factor, combine_multiplier};
use super::shared::NetworkBlocks;
use super::store::{self, Change, DecisionChange, Record, Update, Updated, Write};

use super::{Engine, Error};
use crate::model::SubjectKey;
use crate::telemetry::metrics as names;

/// What one publish of a subject writes and records.
pub(super) struct Plan {
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

impl Engine {
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

    /// [`Engine::apply`] on each of distinct subjects, together: the changes are written to
    /// the durable store (the truth a rebuild reads) while they are applied and published in
    /// the hot store. A durable store that fails does not stop enforcement: the change is
    /// published all the same, logged and counted (`palisade_factor_persist_failures_total`).
    pub(super) async fn apply_many(&self, items: &[(&SubjectKey, &[Change])]) -> Result<(), Error> {
        if items.is_empty() {
            return Ok(());
        }
        let (persisted, applied) = tokio::join!(
            store::durable::write(&self.durable, items, self.clock.now_ms()),
            self.apply_hot(items),
        );
        if let Err(err) = persisted {
            metrics::counter!(names::FACTOR_PERSIST_FAILURES_TOTAL).increment(items.len() as u64);
            tracing::warn!(error.cause = %err, subjects = items.len(), "stored factors not written to the durable store; enforced from the hot store only");
        }
        applied
    }

    /// The hot half of [`Engine::apply_many`] (a rebuild applies what it read from the
    /// durable store with it).
    pub(super) async fn apply_hot(&self, items: &[(&SubjectKey, &[Change])]) -> Result<(), Error> {
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

    /// What publishing `subject` with these stored factors writes; `defaults` are its pull
    /// factors with nothing stored (what readers answer for a class with nothing published).
    pub(super) fn plan(
        &self,
        subject: &SubjectKey,
        stored: &[Factor],
        defaults: &[Factor],
        now: i64,
    ) -> Plan {
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
    pub(super) async fn published(
        &self,
        items: &[(&SubjectKey, &[Change])],
        outcomes: Vec<(Plan, bool)>,
        now: i64,
    ) -> Result<(), Error> {
        let mut changes = Vec::with_capacity(items.len());
        {
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
                self.l1.remove(subject.as_str());
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
        self.next_generation();
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

    /// One step of the due loop: republishes the subjects whose multipliers change now (a
    /// shorter-lived factor expired while a longer one remains). Returns how many.
    pub async fn republish_due(&self) -> Result<usize, Error> {
        let subjects = self.store.take_due(&self.keys, self.clock.now_ms()).await?;
        for subject in &subjects {
            self.rescore(subject).await?;
        }
        Ok(subjects.len())
    }
}

/// Subjects restored per [`Engine::apply_hot`] call by [`Engine::restore`].
const RESTORE_SUBJECTS_PER_CALL: usize = 256;
/// Factor rows read per page by [`Engine::restore`].
const RESTORE_PAGE: u32 = 5000;

impl Engine {
    /// Puts every live stored factor of the durable store back into the hot store and
    /// publishes the multipliers, as after its assertion (the hot store lost its data).
    /// Returns how many subjects.
    pub async fn restore(&self) -> Result<usize, Error> {
        let now = self.clock.now_ms();
        let (mut subject, mut id) = (String::new(), String::new());
        let mut pending: Vec<(SubjectKey, Vec<Change>)> = Vec::new();
        let mut restored = 0;
        loop {
            let page =
                store::durable::live(&self.durable, now, (&subject, &id), RESTORE_PAGE).await?;
            let done = page.len() < RESTORE_PAGE as usize;
            if let Some((last_subject, last_id, _)) = page.last() {
                (subject, id) = (last_subject.as_str().to_owned(), last_id.clone());
            }
            for (key, _, factor) in page {
                // A network's or an ASN's block on `auth` is enforced for its every address.
                if NetworkBlocks::is_network(&key)
                    && factor.value <= 0.0
                    && factor.classes.iter().any(|c| c == "auth")
                    && let Some(until) = factor.expires_at_ms
                {
                    self.networks.block(&key, until).await?;
                }
                match pending.last_mut() {
                    Some((last, changes)) if *last == key => changes.push(Change::Set(factor)),
                    _ => pending.push((key, vec![Change::Set(factor)])),
                }
            }
            // The last subject of a page may go on in the next: it waits for it.
            let ready = if done {
                pending.len()
            } else {
                pending.len().saturating_sub(1)
            };
            for chunk in pending[..ready].chunks(RESTORE_SUBJECTS_PER_CALL) {
                let items: Vec<(&SubjectKey, &[Change])> = chunk
                    .iter()
                    .map(|(key, changes)| (key, &changes[..]))
                    .collect();
                self.apply_hot(&items).await?;
                restored += chunk.len();
            }
            pending.drain(..ready);
            if done {
                return Ok(restored);
            }
        }
    }

    /// Makes `subject`'s factors in this hot store the stored ones (changed in another
    /// region): the durable ones set, the ones only here deleted, and the subject published.
    pub async fn sync_subject(&self, subject: &str) -> Result<(), Error> {
        let Some(key) = SubjectKey::from_text(subject) else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        let (stored, here) = tokio::join!(
            store::durable::of_subject(&self.durable, subject, now),
            self.store.read(&self.keys, &key, now),
        );
        let (stored, here) = (stored?, here?);
        let mut changes: Vec<Change> = here
            .iter()
            .filter(|h| !stored.iter().any(|s| s.signal_code_is(&h.id())))
            .map(|h| Change::Delete(h.id()))
            .collect();
        changes.extend(
            stored
                .into_iter()
                .filter(|s| !here.contains(s))
                .map(Change::Set),
        );
        if changes.is_empty() {
            return Ok(());
        }
        // A network's or an ASN's block on `auth` is enforced for its every address.
        for change in &changes {
            if let Change::Set(factor) = change
                && NetworkBlocks::is_network(&key)
                && factor.value <= 0.0
                && factor.classes.iter().any(|c| c == "auth")
                && let Some(until) = factor.expires_at_ms
            {
                self.networks.block(&key, until).await?;
            }
        }
        self.apply_hot(&[(&key, &changes)]).await
    }

    /// Deletes the durable copies of factors expired by now; how many.
    pub async fn prune_factors(&self) -> Result<u64, Error> {
        Ok(store::durable::prune(&self.durable, self.clock.now_ms()).await?)
    }
}
