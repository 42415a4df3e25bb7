//! The decision history: refused and challenged limit checks, kept for
//! `history.retention_days` so "why was this user refused at 14:02?" has an answer later.
//!
//! On the request path a decision is only noted: the refusals of one key by one budget
//! (and one outcome) within `history.window_s` are counted into one pending entry in
//! memory. Each window the pending entries are explained (every key's multiplier on the
//! class and the factors behind it, as `/v1/multipliers` shows them) and written in one
//! statement. An attack's thousands of 429s a second are one row per key and window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::clock::Clock;
use crate::config::HistorySettings;
use crate::limiter::{Decision, DecisionSink, LimitRequest};
use crate::model::SubjectKey;
use crate::scoring::{Contribution, Engine};
use crate::store::with_pool;
use crate::store::{Durable, Error};
use crate::telemetry::metrics as names;

/// One scope of a decision as the history keeps it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScopeView {
    /// Budget name.
    pub budget: String,
    /// Scope kind (`ip`, `endpoint_user`, …).
    pub scope: String,
    /// The bucket's subject key.
    pub key: String,
    /// Effective capacity.
    pub limit: u64,
    /// Tokens left.
    pub remaining: u64,
    /// Wait until the request would pass, ms.
    pub retry_after_ms: u64,
    /// The subject's multiplier.
    pub multiplier: f64,
    /// The bucket held the request's cost.
    pub allowed: bool,
    /// False for a shadow budget.
    pub enforced: bool,
}

/// One key's multiplier on the class and its reasons, when the entry was written.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyExplanation {
    /// The multiplier.
    pub multiplier: f64,
    /// Every factor that applied.
    pub reasons: Vec<Contribution>,
}

/// What the history keeps of a decision besides its columns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// The scope that decided (its index in `scopes`).
    pub deciding: Option<usize>,
    /// Every scope of the decision, in budget order.
    pub scopes: Vec<ScopeView>,
    /// Per key (`ip:…`, `user:…`, `device:…`): multiplier and reasons.
    pub keys: std::collections::BTreeMap<String, KeyExplanation>,
    /// The challenge's lockout, when the outcome is a challenge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockout_id: Option<String>,
}

/// One entry of the history.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// ULID.
    pub id: String,
    /// The first decision counted, Unix ms.
    pub first_ms: i64,
    /// The last, Unix ms.
    pub last_ms: i64,
    /// Decisions counted.
    pub count: u64,
    /// Endpoint class.
    pub class: String,
    /// `limited` or `challenge`.
    pub outcome: String,
    /// The refusal's reason code (`account_locked`, `ip_rate`, …) or the challenge's.
    pub reason: String,
    /// The request's user key (`user:…`).
    pub user_key: Option<String>,
    /// The client address.
    pub ip: String,
    /// The request's device key (`device:…`).
    pub device_key: Option<String>,
    /// Scopes, keys and reasons (JSON of [`Explanation`]).
    pub explanation: serde_json::Value,
}

/// Which entries to list.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only this user key.
    pub user_key: Option<String>,
    /// Only this client address.
    pub ip: Option<String>,
    /// Only this device key.
    pub device_key: Option<String>,
    /// Only entries whose last decision is at or after this Unix ms.
    pub since_ms: Option<i64>,
    /// Only entries whose first decision is before this Unix ms.
    pub until_ms: Option<i64>,
    /// Only entries older than this id (the previous page's cursor).
    pub before: Option<ulid::Ulid>,
    /// Page size 1..=500.
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PendingKey {
    class: Arc<str>,
    key: Arc<str>,
    budget: Option<Arc<str>>,
    outcome: &'static str,
}

#[derive(Debug)]
struct Pending {
    first_ms: i64,
    last_ms: i64,
    count: u64,
    reason: String,
    user: Option<SubjectKey>,
    ip_key: SubjectKey,
    ip: std::net::IpAddr,
    device: Option<SubjectKey>,
    deciding: Option<usize>,
    scopes: Vec<ScopeView>,
    lockout_id: Option<String>,
}

/// The history: notes decisions, writes them each window, answers searches.
#[derive(Debug)]
pub struct History {
    durable: Durable,
    clock: Arc<dyn Clock>,
    scoring: Arc<Engine>,
    settings: HistorySettings,
    pending: Mutex<HashMap<PendingKey, Pending>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DecisionSink for History {
    fn note(&self, request: &LimitRequest, decision: &Decision) {
        let (outcome, reason, lockout_id) = match &decision.challenge {
            Some(challenge) if decision.allowed => (
                "challenge",
                challenge.reason.code.clone(),
                challenge.lockout_id.clone(),
            ),
            _ => (
                "limited",
                decision.reason_code().unwrap_or("limited").to_owned(),
                None,
            ),
        };
        let deciding = decision.deciding_scope();
        let key = PendingKey {
            class: decision.class.clone(),
            key: deciding.map_or_else(
                || Arc::from(request.ip.addr().to_string()),
                |s| s.subject.clone(),
            ),
            budget: deciding.map(|s| s.budget.clone()),
            outcome,
        };
        let now = decision.now_ms;
        let mut pending = lock(&self.pending);
        if let Some(entry) = pending.get_mut(&key) {
            entry.count += 1;
            entry.last_ms = entry.last_ms.max(now);
            return;
        }
        if pending.len() >= self.settings.max_pending {
            drop(pending);
            metrics::counter!(names::HISTORY_DROPPED_TOTAL).increment(1);
            return;
        }
        pending.insert(
            key,
            Pending {
                first_ms: now,
                last_ms: now,
                count: 1,
                reason,
                user: request.user.clone(),
                ip_key: SubjectKey::ip(&request.ip),
                ip: request.ip.addr(),
                device: request.device.clone(),
                deciding: decision.deciding,
                scopes: decision
                    .scopes
                    .iter()
                    .map(|s| ScopeView {
                        budget: s.budget.to_string(),
                        scope: s.scope.as_str().to_owned(),
                        key: s.subject.to_string(),
                        limit: s.limit,
                        remaining: s.remaining,
                        retry_after_ms: s.retry_after_ms,
                        multiplier: s.multiplier,
                        allowed: s.allowed,
                        enforced: s.enforced,
                    })
                    .collect(),
                lockout_id,
            },
        );
    }
}

/// Rows per multi-row insert: 11 binds each, under SQLite's 32,766.
const ROWS_PER_STATEMENT: usize = 500;

impl History {
    /// The history over the durable store; `scoring` explains the keys.
    pub fn new(
        durable: Durable,
        clock: Arc<dyn Clock>,
        scoring: Arc<Engine>,
        settings: HistorySettings,
    ) -> Self {
        Self {
            durable,
            clock,
            scoring,
            settings,
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Seconds between two writes.
    pub fn window(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.settings.window_s)
    }

    /// Whether decisions are kept.
    pub fn enabled(&self) -> bool {
        self.settings.enabled()
    }

    /// Writes the pending entries (each explained now); returns how many.
    pub async fn flush(&self) -> Result<usize, Error> {
        let pending: Vec<(PendingKey, Pending)> = {
            let mut map = lock(&self.pending);
            if map.is_empty() {
                return Ok(0);
            }
            std::mem::take(&mut *map).into_iter().collect()
        };
        let mut entries = Vec::with_capacity(pending.len());
        for (key, p) in pending {
            let mut subjects = vec![(p.ip_key.clone(), Some(p.ip))];
            subjects.extend(p.user.iter().map(|u| (u.clone(), None)));
            subjects.extend(p.device.iter().map(|d| (d.clone(), None)));
            // An explanation that cannot be read now leaves the keys out, not the entry.
            let keys = self
                .scoring
                .explain(&key.class, &subjects)
                .await
                .map(|explained| {
                    explained
                        .into_iter()
                        .map(|k| {
                            (
                                k.key.to_string(),
                                KeyExplanation {
                                    multiplier: k.combined.multiplier,
                                    reasons: k.combined.contributions.clone(),
                                },
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let explanation = Explanation {
                deciding: p.deciding,
                scopes: p.scopes,
                keys,
                lockout_id: p.lockout_id,
            };
            entries.push(Entry {
                id: self.clock.new_id().to_string(),
                first_ms: p.first_ms,
                last_ms: p.last_ms,
                count: p.count,
                class: key.class.to_string(),
                outcome: key.outcome.to_owned(),
                reason: p.reason,
                user_key: p.user.map(|u| u.to_string()),
                ip: p.ip.to_string(),
                device_key: p.device.map(|d| d.to_string()),
                explanation: serde_json::to_value(&explanation).unwrap_or_default(),
            });
        }
        let written = entries.len();
        if let Err(err) = self.insert(&entries).await {
            let lost: u64 = entries.iter().map(|e| e.count).sum();
            metrics::counter!(names::HISTORY_DROPPED_TOTAL).increment(lost);
            return Err(err);
        }
        metrics::counter!(names::HISTORY_ENTRIES_TOTAL).increment(written as u64);
        Ok(written)
    }

    async fn insert(&self, entries: &[Entry]) -> Result<(), Error> {
        for chunk in entries.chunks(ROWS_PER_STATEMENT) {
            with_pool!(&self.durable, |pool| {
                let mut builder = sqlx::QueryBuilder::new(
                    "INSERT INTO decision_history (id, first_at, last_at, count, class, outcome, \
                     reason, user_key, ip, device_key, explanation) ",
                );
                builder.push_values(chunk, |mut row, e| {
                    row.push_bind(e.id.as_str())
                        .push_bind(e.first_ms)
                        .push_bind(e.last_ms)
                        .push_bind(i64::try_from(e.count).unwrap_or(i64::MAX))
                        .push_bind(e.class.as_str())
                        .push_bind(e.outcome.as_str())
                        .push_bind(e.reason.as_str())
                        .push_bind(e.user_key.as_deref())
                        .push_bind(e.ip.as_str())
                        .push_bind(e.device_key.as_deref())
                        .push_bind(e.explanation.to_string());
                });
                builder.build().execute(pool).await.map(|_| ())
            })?;
        }
        Ok(())
    }

    /// Deletes entries past the retention; returns how many.
    pub async fn prune(&self) -> Result<u64, Error> {
        let days = i64::from(self.settings.retention_days);
        let before = self.clock.now_ms() - days * 86_400_000;
        Ok(with_pool!(&self.durable, |pool| sqlx::query(
            "DELETE FROM decision_history WHERE last_at < $1"
        )
        .bind(before)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?)
    }

    /// Entries matching `query`, newest first, and the cursor of the next page.
    pub async fn list(&self, query: &Query) -> Result<(Vec<Entry>, Option<String>), Error> {
        let limit = query.limit.clamp(1, 500);
        let before = query.before.map(|id| id.to_string());
        let rows: Vec<Row> = with_pool!(&self.durable, |pool| {
            let mut builder = sqlx::QueryBuilder::new(
                "SELECT id, first_at, last_at, count, class, outcome, reason, user_key, ip, \
                 device_key, explanation FROM decision_history WHERE 1 = 1",
            );
            if let Some(user) = &query.user_key {
                builder.push(" AND user_key = ").push_bind(user.as_str());
            }
            if let Some(ip) = &query.ip {
                builder.push(" AND ip = ").push_bind(ip.as_str());
            }
            if let Some(device) = &query.device_key {
                builder
                    .push(" AND device_key = ")
                    .push_bind(device.as_str());
            }
            if let Some(since) = query.since_ms {
                builder.push(" AND last_at >= ").push_bind(since);
            }
            if let Some(until) = query.until_ms {
                builder.push(" AND first_at < ").push_bind(until);
            }
            if let Some(before) = &before {
                builder.push(" AND id < ").push_bind(before.as_str());
            }
            builder
                .push(" ORDER BY id DESC LIMIT ")
                .push_bind(i64::from(limit) + 1);
            builder.build_query_as().fetch_all(pool).await
        })?;
        let mut items: Vec<Entry> = rows.into_iter().map(Entry::from).collect();
        let next = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|e| e.id.clone())
        } else {
            None
        };
        Ok((items, next))
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    first_at: i64,
    last_at: i64,
    count: i64,
    class: String,
    outcome: String,
    reason: String,
    user_key: Option<String>,
    ip: String,
    device_key: Option<String>,
    explanation: String,
}

impl From<Row> for Entry {
    fn from(row: Row) -> Self {
        Entry {
            id: row.id,
            first_ms: row.first_at,
            last_ms: row.last_at,
            count: u64::try_from(row.count).unwrap_or(0),
            class: row.class,
            outcome: row.outcome,
            reason: row.reason,
            user_key: row.user_key,
            ip: row.ip,
            device_key: row.device_key,
            explanation: serde_json::from_str(&row.explanation).unwrap_or_default(),
        }
    }
}
