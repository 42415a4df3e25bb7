//! The traffic record: the inputs of limit checks, written each second when recording.
//!
//! Users, devices and tenants are the keyed pseudonyms logs show (`anon-` and 16 hex digits of
//! HMAC-SHA256(`privacy.pseudonym_key`, id)), and each client a synthetic IPv6 address standing
//! for its address (IPv4) or prefix (IPv6): `fd` and the first 14 hex digits of the address's
//! pseudonym, so `fd3f:a2b1:c4d5:e6f7::1` is the client logs name `anon-3fa2b1c4d5e6f7…`.
//!
//! Each check keeps what the live limiter answered and the multipliers it applied, so a replay
//! can hold the day's signals (offenders, anomalies, lockouts, deny lists) as they were.

use std::net::Ipv6Addr;
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::config::RecordSettings;
use crate::config::ScopeKind;
use crate::limiter::{Decision, LimitRequest, TrafficSink};
use crate::model::SubjectKey;
use crate::store::with_pool;
use crate::store::{Durable, Error};
use crate::telemetry::metrics as names;
use crate::telemetry::privacy::Pseudonyms;

/// What the live limiter answered a recorded check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Allowed.
    Allowed,
    /// Refused.
    Refused,
    /// Allowed on condition of a step-up (a challenge).
    Challenged,
}

impl Outcome {
    /// Of a decision.
    pub fn of(decision: &Decision) -> Self {
        match (decision.allowed, decision.challenge.is_some()) {
            (false, _) => Outcome::Refused,
            (true, true) => Outcome::Challenged,
            (true, false) => Outcome::Allowed,
        }
    }

    fn code(self) -> i64 {
        match self {
            Outcome::Allowed => 0,
            Outcome::Refused => 1,
            Outcome::Challenged => 2,
        }
    }

    fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(Outcome::Allowed),
            1 => Some(Outcome::Refused),
            2 => Some(Outcome::Challenged),
            _ => None,
        }
    }
}

/// The multipliers a check's subjects had (1: none), per kind of subject: an address's
/// applies to its `ip` and `endpoint_ip` budgets, a device's to `device` and `ip_device`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Multipliers {
    /// The client address's.
    pub ip: f64,
    /// The user's.
    pub user: f64,
    /// The device's.
    pub device: f64,
    /// The tenant's.
    pub tenant: f64,
}

impl Default for Multipliers {
    fn default() -> Self {
        Self {
            ip: 1.0,
            user: 1.0,
            device: 1.0,
            tenant: 1.0,
        }
    }
}

impl Multipliers {
    /// The ones a decision applied (the lowest where two budgets of one subject differ).
    pub fn of(decision: &Decision) -> Self {
        let mut out = Self::default();
        for scope in &decision.scopes {
            let slot = match scope.scope {
                ScopeKind::Ip | ScopeKind::EndpointIp => &mut out.ip,
                ScopeKind::User | ScopeKind::EndpointUser => &mut out.user,
                ScopeKind::Device | ScopeKind::IpDevice => &mut out.device,
                ScopeKind::Tenant => &mut out.tenant,
                ScopeKind::Global | ScopeKind::Recipient | ScopeKind::Destination => continue,
            };
            *slot = slot.min(scope.multiplier);
        }
        out
    }

    /// The multiplier of the subject a budget of `scope` keys (1 for global, recipient and
    /// destination budgets, which no signal scales per subject here).
    pub fn of_scope(&self, scope: ScopeKind) -> f64 {
        match scope {
            ScopeKind::Ip | ScopeKind::EndpointIp => self.ip,
            ScopeKind::User | ScopeKind::EndpointUser => self.user,
            ScopeKind::Device | ScopeKind::IpDevice => self.device,
            ScopeKind::Tenant => self.tenant,
            ScopeKind::Global | ScopeKind::Recipient | ScopeKind::Destination => 1.0,
        }
    }

    /// Whether any subject was scaled down (a signal flagged it).
    pub fn flagged(&self) -> bool {
        self.each().any(|(_, value)| value < 1.0)
    }

    fn each(&self) -> impl Iterator<Item = (&'static str, f64)> {
        [
            ("ip", self.ip),
            ("user", self.user),
            ("device", self.device),
            ("tenant", self.tenant),
        ]
        .into_iter()
    }

    /// As stored: `ip=0.5 user=0`, the ones that are not 1; None when all are.
    pub fn text(&self) -> Option<String> {
        let parts: Vec<String> = self
            .each()
            .filter(|(_, value)| *value != 1.0)
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        (!parts.is_empty()).then(|| parts.join(" "))
    }

    /// From [`Self::text`]'s form; what it cannot read stays 1.
    pub fn parse(text: &str) -> Self {
        let mut out = Self::default();
        for part in text.split_whitespace() {
            let Some((name, value)) = part.split_once('=') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if !value.is_finite() || value < 0.0 {
                continue;
            }
            match name {
                "ip" => out.ip = value,
                "user" => out.user = value,
                "device" => out.device = value,
                "tenant" => out.tenant = value,
                _ => {}
            }
        }
        out
    }
}

/// One recorded check as the replay reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// ULID.
    pub id: String,
    /// When it was decided, Unix ms.
    pub at_ms: i64,
    /// HTTP method.
    pub method: String,
    /// Path as sent.
    pub endpoint: String,
    /// The client's synthetic address.
    pub ip: String,
    /// The user's pseudonym.
    pub user: Option<String>,
    /// The device's pseudonym.
    pub device: Option<String>,
    /// The tenant's pseudonym.
    pub tenant: Option<String>,
    /// Tokens it asked for.
    pub cost: u32,
    /// Whether it took them.
    pub consume: bool,
    /// What the live limiter answered (None: recorded before answers were kept).
    pub outcome: Option<Outcome>,
    /// The multipliers it applied.
    pub multipliers: Multipliers,
}

impl Recorded {
    /// Whether the engine had flagged the client when the check was made: a multiplier below
    /// 1 on one of its subjects (deny lists, offenders, anomalies, lockouts, datacenter and
    /// Tor ranges, overrides) or a challenge.
    pub fn flagged(&self) -> bool {
        self.multipliers.flagged() || self.outcome == Some(Outcome::Challenged)
    }
}

#[derive(Debug)]
struct Raw {
    at_ms: i64,
    method: String,
    endpoint: String,
    ip_key: SubjectKey,
    user: Option<SubjectKey>,
    device: Option<SubjectKey>,
    tenant: Option<SubjectKey>,
    cost: u32,
    consume: bool,
    outcome: Outcome,
    multipliers: Multipliers,
}

/// Notes checks on the request path, writes them each second, prunes them.
#[derive(Debug)]
pub struct Recorder {
    durable: Durable,
    clock: Arc<dyn Clock>,
    pseudonyms: Pseudonyms,
    settings: RecordSettings,
    buffer: Mutex<Vec<Raw>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// FNV-1a: the same on every instance and after restarts (sampling must pick the same
/// clients everywhere).
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl TrafficSink for Recorder {
    fn note(&self, request: &LimitRequest, decision: &Decision) {
        let ip_key = SubjectKey::ip(&request.ip);
        if self.settings.sample < 1.0 {
            let client = request.user.as_ref().unwrap_or(&ip_key);
            let bucket = stable_hash(client.as_str()) % 1_000_000;
            if bucket as f64 >= self.settings.sample * 1_000_000.0 {
                return;
            }
        }
        let mut buffer = lock(&self.buffer);
        if buffer.len() >= self.settings.max_buffered {
            drop(buffer);
            metrics::counter!(names::RECORD_DROPPED_TOTAL).increment(1);
            return;
        }
        buffer.push(Raw {
            at_ms: decision.now_ms,
            method: request.method.clone(),
            endpoint: request.endpoint.clone(),
            ip_key,
            user: request.user.clone(),
            device: request.device.clone(),
            tenant: request.tenant.clone(),
            cost: request.cost,
            consume: request.consume,
            outcome: Outcome::of(decision),
            multipliers: Multipliers::of(decision),
        });
    }
}

/// Rows per multi-row insert: 12 binds each, under SQLite's 32,766.
const ROWS_PER_STATEMENT: usize = 1000;

impl Recorder {
    /// A recorder over the durable store; pseudonyms made with `privacy.pseudonym_key`.
    pub fn new(
        durable: Durable,
        clock: Arc<dyn Clock>,
        pseudonyms: Pseudonyms,
        settings: RecordSettings,
    ) -> Self {
        Self {
            durable,
            clock,
            pseudonyms,
            settings,
            buffer: Mutex::new(Vec::new()),
        }
    }

    /// Whether checks are recorded.
    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    /// The synthetic address standing for a client key: `fd` and the first 56 bits of the
    /// address's pseudonym in the top 64 bits, so each client has its own /64 (an IPv6
    /// client's prefix stays one client).
    fn synthetic_ip(&self, ip_key: &SubjectKey) -> String {
        let d = self.pseudonyms.digest(ip_key.id()).unwrap_or_default();
        Ipv6Addr::new(
            0xfd00 | u16::from(d[0]),
            u16::from_be_bytes([d[1], d[2]]),
            u16::from_be_bytes([d[3], d[4]]),
            u16::from_be_bytes([d[5], d[6]]),
            0,
            0,
            0,
            1,
        )
        .to_string()
    }

    /// Writes the buffered checks; returns how many.
    pub async fn flush(&self) -> Result<usize, Error> {
        let raw = std::mem::take(&mut *lock(&self.buffer));
        if raw.is_empty() {
            return Ok(0);
        }
        let rows: Vec<Recorded> = raw
            .into_iter()
            .map(|r| Recorded {
                id: self.clock.new_id().to_string(),
                at_ms: r.at_ms,
                method: r.method,
                endpoint: r.endpoint,
                ip: self.synthetic_ip(&r.ip_key),
                user: r.user.map(|u| self.pseudonyms.of(u.id())),
                device: r.device.map(|d| self.pseudonyms.of(d.id())),
                tenant: r.tenant.map(|t| self.pseudonyms.of(t.id())),
                cost: r.cost,
                consume: r.consume,
                outcome: Some(r.outcome),
                multipliers: r.multipliers,
            })
            .collect();
        for chunk in rows.chunks(ROWS_PER_STATEMENT) {
            let written = with_pool!(&self.durable, |pool| {
                let mut builder = sqlx::QueryBuilder::new(
                    "INSERT INTO traffic_record (id, at, method, endpoint, ip, user_key, \
                     device_key, tenant_key, cost, consume, outcome, multipliers) ",
                );
                builder.push_values(chunk, |mut row, r| {
                    row.push_bind(r.id.as_str())
                        .push_bind(r.at_ms)
                        .push_bind(r.method.as_str())
                        .push_bind(r.endpoint.as_str())
                        .push_bind(r.ip.as_str())
                        .push_bind(r.user.as_deref())
                        .push_bind(r.device.as_deref())
                        .push_bind(r.tenant.as_deref())
                        .push_bind(i64::from(r.cost))
                        .push_bind(i64::from(r.consume))
                        .push_bind(r.outcome.map(Outcome::code))
                        .push_bind(r.multipliers.text());
                });
                builder.build().execute(pool).await.map(|_| ())
            });
            if let Err(err) = written {
                metrics::counter!(names::RECORD_DROPPED_TOTAL).increment(chunk.len() as u64);
                return Err(err.into());
            }
        }
        metrics::counter!(names::RECORD_CHECKS_TOTAL).increment(rows.len() as u64);
        Ok(rows.len())
    }

    /// Deletes checks older than the retention; returns how many.
    pub async fn prune(&self) -> Result<u64, Error> {
        let hours = i64::try_from(self.settings.retention_hours).unwrap_or(i64::MAX);
        let before = self.clock.now_ms() - hours.saturating_mul(3_600_000);
        Ok(with_pool!(&self.durable, |pool| sqlx::query(
            "DELETE FROM traffic_record WHERE at < $1"
        )
        .bind(before)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?)
    }
}

/// Why a window of the record holds no checks, as far as the settings tell: recording off,
/// a window older than the retention, clients left out by sampling, or none made yet.
pub fn why_empty(settings: &RecordSettings, from_ms: i64, now_ms: i64) -> String {
    if !settings.enabled {
        return "recording is off (`record.enabled = false`), so no checks are kept".to_owned();
    }
    let mut reasons = Vec::new();
    let hours = i64::try_from(settings.retention_hours).unwrap_or(i64::MAX);
    let kept_from = now_ms.saturating_sub(hours.saturating_mul(3_600_000));
    if from_ms < kept_from {
        reasons.push(format!(
            "checks are kept {} hours (`record.retention_hours`), so the window's start is pruned",
            settings.retention_hours
        ));
    }
    if settings.sample < 1.0 {
        reasons.push(format!(
            "{} % of clients are recorded (`record.sample`)",
            settings.sample * 100.0
        ));
    }
    reasons.push(
        "no checks were made in the window, or they are not written yet (each second)".to_owned(),
    );
    reasons.join("; or ")
}

type Row = (
    String,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
    i64,
    Option<i64>,
    Option<String>,
);

/// The first and last recorded check's time from `from_ms` to before `to_ms` (None: none).
pub async fn span(
    durable: &Durable,
    from_ms: i64,
    to_ms: i64,
) -> Result<Option<(i64, i64)>, Error> {
    let row: (Option<i64>, Option<i64>) = with_pool!(durable, |pool| {
        sqlx::query_as("SELECT MIN(at), MAX(at) FROM traffic_record WHERE at >= $1 AND at < $2")
            .bind(from_ms)
            .bind(to_ms)
            .fetch_one(pool)
            .await
    })?;
    Ok(row.0.zip(row.1))
}

/// Recorded checks from `from_ms` to before `to_ms` after the position `after` (`(at, id)`),
/// in the order they were decided, at most `limit`.
///
/// The cursor is a row comparison, which the `(at, id)` index starts at (an `OR` of its
/// parts is a filter over every row before).
pub async fn read(
    durable: &Durable,
    from_ms: i64,
    to_ms: i64,
    after: Option<&(i64, String)>,
    limit: u32,
) -> Result<Vec<Recorded>, Error> {
    let (after_at, after_id) = after
        .map(|(at, id)| (*at, id.clone()))
        .unwrap_or((i64::MIN, String::new()));
    let rows: Vec<Row> = with_pool!(durable, |pool| {
        sqlx::query_as(
        "SELECT id, at, method, endpoint, ip, user_key, device_key, tenant_key, cost, consume, \
         outcome, multipliers FROM traffic_record WHERE at >= $1 AND at < $2 AND (at, id) > ($3, $4) \
         ORDER BY at, id LIMIT $5"
    )
    .bind(from_ms)
    .bind(to_ms)
    .bind(after_at)
    .bind(after_id)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await
    })?;
    Ok(rows
        .into_iter()
        .map(
            |(
                id,
                at_ms,
                method,
                endpoint,
                ip,
                user,
                device,
                tenant,
                cost,
                consume,
                outcome,
                multipliers,
            )| Recorded {
                id,
                at_ms,
                method,
                endpoint,
                ip,
                user,
                device,
                tenant,
                cost: u32::try_from(cost).unwrap_or(1),
                consume: consume != 0,
                outcome: outcome.and_then(Outcome::from_code),
                multipliers: multipliers
                    .as_deref()
                    .map(Multipliers::parse)
                    .unwrap_or_default(),
            },
        )
        .collect())
}
