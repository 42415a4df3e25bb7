//! Ingest: auth-event batches parsed with per-index errors, stored idempotently, then fed to
//! the lockout signals; request-telemetry batches ([`requests`]) stored, then fed to scoring.
//!
//! A 2xx means every event of the batch is durably stored (the SQL insert commits before the
//! answer, and before any failure's consequences run: a lockout lists its events from the
//! store). The velocity windows are updated while the insert runs; they count event ids, so a
//! retried batch counts nothing twice even if a previous attempt failed half-way (its store
//! or its signals).

mod parse; // a batch's events read and checked, every bad one with its index
mod replay; // the stored events back into the hot store's windows after it lost them
pub mod requests;
mod store;

pub use parse::{parse_auth_batch, validate_auth_batch};

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use crate::clock::Clock;
use crate::lockout::{AccountStatus, Lockouts, LoginContext, LoginEvent};
use crate::model::{ClientIp, Identifiers, SubjectKey};
use crate::scoring::Engine;
use crate::store::Durable;
use crate::telemetry::metrics as names;

/// Largest auth batch.
pub const MAX_AUTH_BATCH: usize = 1000;
/// Events older than this are rejected (ms).
pub const MAX_AGE_MS: i64 = 24 * 3_600_000;
/// Events further in the future than this are rejected (ms).
pub const MAX_FUTURE_MS: i64 = 5 * 60_000;

/// Kind of an auth event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    /// Wrong password, wrong OTP, …
    LoginFailure,
    /// A login that succeeded.
    LoginSuccess,
    /// The person passed the step-up of a login challenge (`challenge_id`): the context
    /// becomes known to the account; not a login (no window counts it).
    ChallengePassed,
}

impl AuthKind {
    /// Name in JSON and SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthKind::LoginFailure => "login_failure",
            AuthKind::LoginSuccess => "login_success",
            AuthKind::ChallengePassed => "challenge_passed",
        }
    }
}

/// A batch of auth events as posted, every event well-formed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthBatch {
    /// The events, not yet validated.
    pub events: Vec<RawAuthEvent>,
}

/// An auth event as posted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthEvent {
    event_id: String,
    #[serde(rename = "type")]
    kind: AuthKind,
    account: String,
    ip: String,
    #[serde(default)]
    device_id: Option<String>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    challenge_id: Option<String>,
}

/// A validated auth event.
#[derive(Debug, Clone)]
pub struct AuthEvent {
    /// Idempotency key, 1–128 printable characters.
    pub event_id: String,
    /// Failure or success.
    pub kind: AuthKind,
    /// Subjects of the attempt (the account by its canonical id).
    pub context: LoginContext,
    /// The account as the auth service spelled it, when that differs from the canonical id
    /// (kept with the event for analysts).
    pub account_received: Option<String>,
    /// Device id (trimmed; otherwise as sent).
    pub device_id: Option<String>,
    /// Endpoint, at most 2048 bytes.
    pub endpoint: Option<String>,
    /// Event time, Unix ms (time of receipt when absent).
    pub ts_ms: i64,
    /// The caller sent `ts` (a retry is compared on it only then).
    pub ts_given: bool,
    /// The login challenge passed (`challenge_passed` only; checked against the challenges
    /// issued before the batch is stored, not stored itself).
    pub challenge_id: Option<String>,
}

impl AuthEvent {
    /// The event as the lockout signals record it.
    pub fn login_event(&self) -> LoginEvent<'_> {
        LoginEvent {
            context: &self.context,
            event_id: &self.event_id,
            ts_ms: self.ts_ms,
            failure: self.kind == AuthKind::LoginFailure,
            step_up: self.kind == AuthKind::ChallengePassed,
        }
    }
}

impl store::StoredEvent {
    /// The stored event as an event of this batch would be (its account is canonical
    /// already); None for a row that does not parse (not written by this service).
    fn as_event(&self, limits: Limits) -> Option<AuthEvent> {
        let ip = ClientIp::parse(&self.ip, limits.ipv6_prefix_len)?;
        let kind = match self.kind.as_str() {
            "login_failure" => AuthKind::LoginFailure,
            "login_success" => AuthKind::LoginSuccess,
            "challenge_passed" => AuthKind::ChallengePassed,
            _ => return None,
        };
        Some(AuthEvent {
            event_id: self.event_id.clone(),
            kind,
            account_received: None,
            context: LoginContext {
                account: SubjectKey::user(&self.account, usize::MAX).ok()?,
                account_name: self.account.clone(),
                ip_key: SubjectKey::ip(&ip),
                ip,
                device: self
                    .device_id
                    .as_deref()
                    .and_then(|d| SubjectKey::device(d, usize::MAX).ok()),
            },
            device_id: self.device_id.clone(),
            endpoint: self.endpoint.clone(),
            ts_ms: self.ts,
            ts_given: true,
            challenge_id: None,
        })
    }
}

/// How `event` differs from the stored event with its id (the fields its sender controls),
/// or None when it is the same event: a retry.
fn differences(event: &AuthEvent, stored: &store::StoredEvent) -> Option<String> {
    let mut fields = Vec::new();
    if event.kind.as_str() != stored.kind {
        fields.push("type");
    }
    if event.context.account_name != stored.account {
        fields.push("account");
    }
    if event.context.ip.addr().to_string() != stored.ip {
        fields.push("ip");
    }
    if event.device_id != stored.device_id {
        fields.push("device_id");
    }
    if event.endpoint != stored.endpoint {
        fields.push("endpoint");
    }
    if event.ts_given && event.ts_ms != stored.ts {
        fields.push("ts");
    }
    (!fields.is_empty()).then(|| {
        format!(
            "event_id {:?} was stored before with another {}",
            stored.event_id,
            fields.join(", ")
        )
    })
}

/// One bad event of a batch.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EventError {
    /// Position in `events`.
    pub index: usize,
    /// What is wrong.
    pub reason: String,
}

/// Limits that apply when parsing.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How account and device ids become canonical (and their longest length).
    pub ids: Identifiers,
    /// IPv6 prefix for IP subjects.
    pub ipv6_prefix_len: u8,
}

/// The result of an accepted batch.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Events stored now.
    pub accepted: u64,
    /// Events stored before (same `event_id`).
    pub duplicates: u64,
    /// Per account of the batch (in first-seen order): what to do for its latest context.
    pub decisions: Vec<(String, AccountStatus)>,
}

/// Why a batch could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A store failed (the durable insert failing means nothing was stored).
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    /// The lockout signals failed after the events were stored.
    #[error(transparent)]
    Lockout(#[from] crate::lockout::Error),
    /// Scoring failed after the events were stored.
    #[error(transparent)]
    Scoring(#[from] crate::scoring::Error),
    /// Events reuse an id stored before with other content; nothing was stored.
    #[error("{} events reuse an event_id stored with other content; nothing was stored", .0.len())]
    Conflict(Vec<EventError>),
    /// `challenge_passed` events name challenges not issued for their accounts (or
    /// expired); nothing was stored.
    #[error("{} challenge_passed events name no challenge issued for their account; nothing was stored", .0.len())]
    Challenges(Vec<EventError>),
}

/// The result of an accepted telemetry batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestsOutcome {
    /// Events counted (0 for a batch already stored under the same `batch_id`).
    pub accepted: usize,
    /// True when the batch id was stored before (nothing counted twice).
    pub duplicate: bool,
    /// Keys that became anomalous.
    pub anomalies: usize,
}

/// The ingest service.
#[derive(Debug, Clone)]
pub struct Ingest {
    durable: Durable,
    clock: Arc<dyn Clock>,
    lockouts: Arc<Lockouts>,
    scoring: Arc<Engine>,
}

impl Ingest {
    /// Ingest over the durable store, feeding `lockouts` (auth events) and `scoring`
    /// (request telemetry).
    pub fn new(
        durable: Durable,
        clock: Arc<dyn Clock>,
        lockouts: Arc<Lockouts>,
        scoring: Arc<Engine>,
    ) -> Self {
        Self {
            durable,
            clock,
            lockouts,
            scoring,
        }
    }

    /// The clock's now (for parsing relative to the same time the service uses).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Every `challenge_passed` of the batch names a challenge issued for its account.
    async fn check_challenges(&self, events: &[AuthEvent]) -> Result<(), Error> {
        let passed: Vec<(usize, (&SubjectKey, &str))> = events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((i, (&e.context.account, e.challenge_id.as_deref()?))))
            .collect();
        if passed.is_empty() {
            return Ok(());
        }
        let asked: Vec<(&SubjectKey, &str)> = passed.iter().map(|(_, c)| *c).collect();
        let checked = self.lockouts.check_challenges(&asked).await?;
        let errors: Vec<EventError> = passed
            .iter()
            .zip(checked)
            .filter_map(|((index, _), result)| {
                let rejection = result.err()?;
                Some(EventError {
                    index: *index,
                    reason: rejection.message().to_owned(),
                })
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Challenges(errors))
        }
    }

    /// Stores a parsed batch (idempotent by `event_id`), then feeds every event to the
    /// lockout signals and answers each account's status.
    ///
    /// The batch's window operations run as one hot-store call (one script on a single
    /// Redis), account by account and each account's events in time order; the statuses
    /// are one more call and one pipeline.
    pub async fn auth_events(&self, events: Vec<AuthEvent>) -> Result<Outcome, Error> {
        self.check_challenges(&events).await?;
        let now = self.clock.now_ms();
        for event in &events {
            metrics::histogram!(names::INGEST_LAG_SECONDS, "source" => "auth")
                .record((now - event.ts_ms).max(0) as f64 / 1000.0);
        }
        // Accounts in first-seen order, each with its events in time order.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            let slot = *index
                .entry(event.context.account_name.as_str())
                .or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                });
            groups[slot].push(i);
        }
        for group in &mut groups {
            group.sort_by_key(|&i| events[i].ts_ms);
        }
        // Every event in one sequence, account by account (each in time order): one
        // hot-store call records the whole batch while the batch is stored, then each
        // failure's consequences follow (a lockout lists its events from the store); each
        // account's status is taken at its latest event. The windows count by event id,
        // so when the store fails and the client retries, nothing is counted twice.
        let mut latest = Vec::with_capacity(groups.len());
        let mut ordered: Vec<LoginEvent<'_>> = Vec::with_capacity(events.len());
        for group in &groups {
            ordered.extend(group.iter().map(|&i| events[i].login_event()));
            latest.push(ordered.len() - 1);
        }
        let (inserted, recorded) = tokio::join!(
            store::insert_auth(&self.durable, &events, now),
            self.lockouts.record_windows(&ordered, &latest),
        );
        let accepted = match inserted? {
            store::Inserted::Stored(accepted) => accepted,
            store::Inserted::Conflicts(conflicts, new) => {
                // The windows counted the batch meanwhile: what they counted of the events
                // not stored goes (the conflicting ones', and the new ones', which a
                // corrected retry counts again, once).
                self.uncount(&events, &conflicts, &new).await;
                return Err(Error::Conflict(
                    conflicts
                        .iter()
                        .map(|(index, stored)| EventError {
                            index: *index,
                            reason: differences(&events[*index], stored).unwrap_or_default(),
                        })
                        .collect(),
                ));
            }
        };
        let duplicates = events.len() as u64 - accepted;
        if duplicates == 0 {
            Lockouts::challenges_passed(
                events
                    .iter()
                    .filter(|e| e.kind == AuthKind::ChallengePassed)
                    .count(),
            );
        }
        let statuses = self.lockouts.settle(&ordered, &latest, recorded?).await?;
        let decisions = groups
            .iter()
            .map(|group| events[group[0]].context.account_name.clone())
            .zip(statuses)
            .collect();
        Ok(Outcome {
            accepted,
            duplicates,
            decisions,
        })
    }

    /// Takes back what the windows counted of a refused batch's events that are not stored:
    /// the conflicting ones (the stored event of the same id keeps what it counted) and the
    /// new ones. A failure here is logged: the windows then hold entries the database does
    /// not, until they age out.
    async fn uncount(
        &self,
        events: &[AuthEvent],
        conflicts: &[(usize, store::StoredEvent)],
        new: &[usize],
    ) {
        let limits = Limits {
            ids: Identifiers {
                accounts: crate::model::AccountIds::Exact,
                max_len: usize::MAX,
            },
            ipv6_prefix_len: events
                .first()
                .map_or(64, |e| e.context.ip.ipv6_prefix_len()),
        };
        let pairs: Vec<(&AuthEvent, Option<AuthEvent>)> = conflicts
            .iter()
            .map(|(index, stored)| (&events[*index], stored.as_event(limits)))
            .chain(new.iter().map(|&index| (&events[index], None)))
            .collect();
        let taken: Vec<(LoginEvent<'_>, Option<LoginEvent<'_>>)> = pairs
            .iter()
            .map(|(event, original)| {
                (
                    event.login_event(),
                    original.as_ref().map(AuthEvent::login_event),
                )
            })
            .collect();
        if let Err(err) = self.lockouts.uncount(&taken).await {
            tracing::warn!(error.cause = %err, "the windows keep entries of refused events");
        }
    }

    /// Deletes telemetry batches received before `older_than_ms`; returns how many.
    pub async fn prune_requests_once(&self, older_than_ms: i64) -> Result<u64, Error> {
        Ok(store::prune_request_batches(&self.durable, older_than_ms).await?)
    }

    /// Deletes raw auth events older than `older_than_ms` (lockouts are kept); returns the
    /// number deleted. Run by a background task; tests call it directly.
    pub async fn prune_once(&self, older_than_ms: i64) -> Result<u64, Error> {
        Ok(store::prune(&self.durable, older_than_ms).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::value::RawValue;

    fn raw(values: Vec<serde_json::Value>) -> Vec<Box<RawValue>> {
        values
            .iter()
            .map(|v| serde_json::value::to_raw_value(v).unwrap())
            .collect()
    }

    const LIMITS: Limits = Limits {
        ids: Identifiers {
            accounts: crate::model::AccountIds::CaseInsensitive,
            max_len: 64,
        },
        ipv6_prefix_len: 64,
    };

    #[test]
    fn a_bad_event_rejects_the_batch_with_every_index_and_reason() {
        let now = 1_800_000_000_000;
        let batch = vec![
            json!({"event_id": "a", "type": "login_failure", "account": "alice", "ip": "192.0.2.1"}),
            json!({"event_id": "b", "type": "login_maybe", "account": "alice", "ip": "192.0.2.1"}),
            json!({"event_id": "c", "type": "login_failure", "account": "alice", "ip": "nope"}),
            json!({"event_id": "d", "type": "login_failure", "account": "alice", "ip": "192.0.2.1", "ts": "2020-01-01T00:00:00Z"}),
            json!({"event_id": "", "type": "login_failure", "account": "alice", "ip": "192.0.2.1"}),
        ];
        let errors = parse_auth_batch(&raw(batch), now, LIMITS).unwrap_err();
        let indexes: Vec<usize> = errors.iter().map(|e| e.index).collect();
        assert_eq!(indexes, vec![1, 2, 3, 4]);
        assert!(errors[2].reason.contains("24 h"));
    }

    #[test]
    fn ipv4_mapped_addresses_and_timestamps_are_normalised() {
        let now = 1_800_000_000_000;
        let ts = chrono::DateTime::from_timestamp_millis(now - 1000)
            .unwrap()
            .to_rfc3339();
        let batch = vec![
            json!({"event_id": "a", "type": "login_success", "account": "bob", "ip": "::ffff:198.51.100.4", "ts": ts}),
        ];
        let events = parse_auth_batch(&raw(batch), now, LIMITS).unwrap();
        assert_eq!(events[0].context.ip.addr().to_string(), "198.51.100.4");
        assert_eq!(events[0].ts_ms, now - 1000);
    }
}
