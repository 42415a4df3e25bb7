//! The in-process factor store (embedded mode): std Mutexes, never held across `.await`;
//! multipliers go to the in-process hot store.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use futures_util::future::BoxFuture;

use super::{
    Change, DUE_BATCH, DecisionChange, Factor, Factors, Page, Record, STREAM_LEN, Stored, Update,
    Updated, Write, stream_id,
};
use crate::model::SubjectKey;
use crate::store::{Error, Keys, MemoryHot};

/// One subject's version and stored factors by id.
type VersionedFactors = (u64, BTreeMap<String, Factor>);
/// In-process factors and the decision stream of this process.
#[derive(Debug)]
pub(super) struct MemoryFactors {
    subjects: Mutex<HashMap<String, VersionedFactors>>,
    due: Mutex<BTreeSet<(i64, String)>>,
    active: Mutex<HashMap<String, i64>>,
    stream: Mutex<(u64, VecDeque<DecisionChange>)>,
    hot: MemoryHot,
}

impl MemoryFactors {
    pub(super) fn new(hot: MemoryHot) -> Self {
        MemoryFactors {
            subjects: Mutex::default(),
            due: Mutex::default(),
            active: Mutex::default(),
            stream: Mutex::default(),
            hot,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Factors for MemoryFactors {
    fn update<'a>(
        &'a self,
        _keys: &'a Keys,
        now_ms: i64,
        items: &'a [Update<'a>],
    ) -> BoxFuture<'a, Result<Vec<Updated>, Error>> {
        Box::pin(async move {
            let memory = self;
            let mut subjects = lock(&memory.subjects);
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                if subjects.len() >= 1024 && subjects.len().is_power_of_two() {
                    subjects.retain(|_, (_, factors)| {
                        factors.retain(|_, f| !f.has_expired(now_ms));
                        !factors.is_empty()
                    });
                }
                let entry = subjects
                    .entry(item.subject.as_str().to_owned())
                    .or_default();
                for change in item.changes {
                    match change {
                        Change::Set(factor) => {
                            entry.1.insert(factor.id(), factor.clone());
                        }
                        Change::Delete(id) => {
                            entry.1.remove(id);
                        }
                    }
                }
                entry.1.retain(|_, f| !f.has_expired(now_ms));
                entry.0 += 1;
                out.push(Updated::Stored(Stored {
                    version: entry.0,
                    factors: entry.1.values().cloned().collect(),
                }));
            }
            Ok(out)
        })
    }

    fn read<'a>(
        &'a self,
        _keys: &'a Keys,
        subject: &'a SubjectKey,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<Vec<Factor>, Error>> {
        Box::pin(async move {
            let memory = self;
            Ok(lock(&memory.subjects)
                .get(subject.as_str())
                .map(|(_, factors)| {
                    factors
                        .values()
                        .filter(|f| !f.has_expired(now_ms))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default())
        })
    }

    fn publish<'a>(
        &'a self,
        _keys: &'a Keys,
        subject: &'a SubjectKey,
        version: u64,
        writes: &'a [Write],
        ttl_ms: Option<u64>,
        now_us: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let memory = self;
            let hot = &self.hot;
            // Under the subjects lock, so no newer change can slip between check and write.
            let subjects = lock(&memory.subjects);
            let current = subjects.get(subject.as_str()).map_or(0, |(v, _)| *v);
            if current != version {
                return Ok(false);
            }
            for (key, value) in writes {
                match value {
                    Some(value) => hot.set_multiplier(
                        key,
                        *value,
                        now_us,
                        ttl_ms.map(|ms| ms.saturating_mul(1000)),
                    ),
                    None => hot.clear_multiplier(key),
                }
            }
            Ok(true)
        })
    }

    fn record<'a>(
        &'a self,
        keys: &'a Keys,
        records: &'a [Record<'a>],
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let memory = self;
            for record in records {
                let subject = record.subject.as_str();
                match record.active {
                    Some(until) => lock(&memory.active).insert(subject.to_owned(), until),
                    None => lock(&memory.active).remove(subject),
                };
                if let Some(at) = record.due_ms {
                    lock(&memory.due).insert((at, subject.to_owned()));
                }
                self.append(keys, record.change).await?;
            }
            Ok(())
        })
    }

    fn append_all<'a>(
        &'a self,
        _keys: &'a Keys,
        changes: &'a [DecisionChange],
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let memory = self;
            let mut stream = lock(&memory.stream);
            for change in changes {
                stream.0 += 1;
                let mut change = change.clone();
                change.cursor = stream.0.to_string();
                stream.1.push_back(change);
            }
            while stream.1.len() > STREAM_LEN {
                stream.1.pop_front();
            }
            Ok(())
        })
    }

    fn changes<'a>(
        &'a self,
        _keys: &'a Keys,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, Error>> {
        Box::pin(async move {
            let memory = self;
            let stream = lock(&memory.stream);
            let newest = stream.0;
            let Some(cursor) = cursor else {
                return Ok(Page {
                    next: newest.to_string(),
                    ..Page::default()
                });
            };
            let after = stream_id(cursor).0;
            let oldest = stream
                .1
                .front()
                .map_or(newest + 1, |c| stream_id(&c.cursor).0);
            // Trimmed entries after the cursor, or a cursor this process never issued (one
            // from before a restart: the stream in between is gone).
            let reset = (after + 1 < oldest && after < newest) || after > newest;
            let items: Vec<DecisionChange> = stream
                .1
                .iter()
                .filter(|c| stream_id(&c.cursor).0 > after)
                .take(limit)
                .cloned()
                .collect();
            let next = items
                .last()
                .map_or_else(|| after.to_string(), |c| c.cursor.clone());
            Ok(Page {
                changes: items,
                next,
                reset,
            })
        })
    }

    fn take_due<'a>(
        &'a self,
        _keys: &'a Keys,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<Vec<SubjectKey>, Error>> {
        Box::pin(async move {
            let memory = self;
            let mut due = lock(&memory.due);
            let mut taken = Vec::new();
            while let Some(first) = due.first() {
                if first.0 > now_ms || taken.len() >= DUE_BATCH {
                    break;
                }
                if let Some((_, subject)) = due.pop_first() {
                    taken.extend(SubjectKey::from_text(&subject));
                }
            }
            Ok(taken)
        })
    }

    fn active<'a>(
        &'a self,
        _keys: &'a Keys,
        now_ms: i64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<SubjectKey>, Error>> {
        Box::pin(async move {
            let memory = self;
            let mut active = lock(&memory.active);
            active.retain(|_, until| *until > now_ms);
            let mut subjects: Vec<&String> = active.keys().collect();
            subjects.sort();
            Ok(subjects
                .into_iter()
                .take(limit)
                .filter_map(|s| SubjectKey::from_text(s))
                .collect())
        })
    }
}
