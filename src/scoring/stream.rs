//! The decision stream (`/v1/decisions`): changes to multipliers, lockouts and list entries
//! in order, and a snapshot of everything in force for a follower starting over.

use std::collections::{BTreeMap, BTreeSet};

use super::factor::combine;
use super::store::DecisionChange;

use super::{Engine, Error, SNAPSHOT_LIMIT, store};

impl Engine {
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
    ///
    /// A cursor from before the hot store's current epoch (the stream was lost with it and
    /// rebuilt) is answered with a reset too: what changed in between is not in the stream.
    pub async fn changes(&self, cursor: Option<&str>, limit: usize) -> Result<store::Page, Error> {
        let mut page = self.store.changes(&self.keys, cursor, limit).await?;
        let since = self
            .stream_since_ms
            .load(std::sync::atomic::Ordering::Acquire);
        // Redis cursors are `<ms>-<seq>`; in-process ones count from the process's start and
        // are answered by the in-process store (a cursor it never issued is a reset).
        if let Some((ms, _)) = cursor.and_then(|c| c.split_once('-'))
            && ms.parse::<i64>().is_ok_and(|ms| ms > 0 && ms < since)
        {
            page.reset = true;
        }
        Ok(page)
    }

    /// The hot store's current epoch began at `since_ms` (recovery tells every instance).
    pub fn set_stream_since(&self, since_ms: i64) {
        self.stream_since_ms
            .store(since_ms, std::sync::atomic::Ordering::Release);
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
}
