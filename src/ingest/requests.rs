//! Request telemetry: batches of what a gateway served, parsed with per-index errors, stored
//! as one row per batch, then counted into scoring's baselines and repeat offenders.

use std::collections::HashMap;

use serde::Deserialize;

use super::parse::parse_ts;
use super::{Error, Limits, MAX_AGE_MS, MAX_FUTURE_MS, RequestsOutcome, names, store};
use crate::model::{ClientIp, SubjectKey};

/// Largest request-telemetry batch.
pub const MAX_REQUEST_BATCH: usize = 5000;

/// A telemetry event as posted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequestEvent {
    #[serde(default)]
    ts: Option<String>,
    ip: String,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    device_id: Option<String>,
    endpoint: String,
    status: u16,
}

/// A validated telemetry event.
#[derive(Debug, Clone)]
pub struct RequestEvent {
    /// When it was served, Unix ms (time of receipt when absent).
    pub ts_ms: i64,
    /// The client.
    pub ip: ClientIp,
    /// `user:…`, if authenticated.
    pub user: Option<SubjectKey>,
    /// `device:…`, if known.
    pub device: Option<SubjectKey>,
    /// Path served.
    pub endpoint: String,
    /// HTTP status answered (429 counts towards repeat offenders).
    pub status: u16,
}

fn parse_one(
    value: &serde_json::Value,
    now_ms: i64,
    limits: Limits,
) -> Result<RequestEvent, String> {
    let raw = RawRequestEvent::deserialize(value).map_err(|e| e.to_string())?;
    let ip = ClientIp::parse(&raw.ip, limits.ipv6_prefix_len)
        .ok_or_else(|| format!("ip {:.64?} is not an IP address", raw.ip))?;
    let user = raw
        .user_id
        .as_deref()
        .map(|id| limits.ids.user_key("user_id", id))
        .transpose()
        .map_err(|e| e.to_string())?;
    let device = raw
        .device_id
        .as_deref()
        .map(|id| limits.ids.device_key(id))
        .transpose()
        .map_err(|e| e.to_string())?;
    crate::limiter::target::validate(&raw.endpoint).map_err(|e| e.to_string())?;
    if !(100..=599).contains(&raw.status) {
        return Err(format!(
            "status {} is not an HTTP status (100-599)",
            raw.status
        ));
    }
    let ts_ms = parse_ts(raw.ts.as_deref(), now_ms)?;
    if ts_ms < now_ms - MAX_AGE_MS {
        return Err("ts is more than 24 h in the past".to_owned());
    }
    if ts_ms > now_ms + MAX_FUTURE_MS {
        return Err("ts is more than 5 min in the future".to_owned());
    }
    Ok(RequestEvent {
        ts_ms,
        ip,
        user,
        device,
        endpoint: raw.endpoint,
        status: raw.status,
    })
}

/// Parses a batch; any bad event rejects the whole batch with every bad index and reason.
pub fn parse_request_batch(
    values: &[serde_json::Value],
    now_ms: i64,
    limits: Limits,
) -> Result<Vec<RequestEvent>, Vec<super::EventError>> {
    let mut events = Vec::with_capacity(values.len());
    let mut errors = Vec::new();
    for (index, value) in values.iter().enumerate() {
        match parse_one(value, now_ms, limits) {
            Ok(event) => events.push(event),
            Err(reason) => errors.push(super::EventError { index, reason }),
        }
    }
    if errors.is_empty() {
        Ok(events)
    } else {
        Err(errors)
    }
}

impl super::Ingest {
    /// Stores a telemetry batch (one row; `batch_id` makes a retry count nothing twice), then
    /// counts every event into scoring: baselines for its IP, user and device, and 429s
    /// towards repeat offenders. `body` is the batch as posted.
    pub async fn requests(
        &self,
        batch_id: Option<&str>,
        events: &[RequestEvent],
        body: &str,
    ) -> Result<RequestsOutcome, Error> {
        let now = self.clock.now_ms();
        let id = batch_id.map_or_else(|| self.clock.new_id().to_string(), str::to_owned);
        if !store::insert_request_batch(&self.durable, &id, now, events.len(), body).await? {
            return Ok(RequestsOutcome {
                accepted: 0,
                duplicate: true,
                anomalies: 0,
            });
        }
        metrics::counter!(names::TELEMETRY_EVENTS_TOTAL).increment(events.len() as u64);
        let mut anomalies = Vec::new();
        // Per key and minute, what this batch counted: merged with the other instances'.
        let shared = self.scoring.shares_counts();
        let mut counts: HashMap<(crate::model::SubjectKey, u32), u32> = HashMap::new();
        for event in events {
            metrics::histogram!(names::INGEST_LAG_SECONDS, "source" => "requests")
                .record((now - event.ts_ms).max(0) as f64 / 1000.0);
            let ip = crate::model::SubjectKey::ip(&event.ip);
            let mut keys = vec![&ip];
            keys.extend(event.user.as_ref());
            keys.extend(event.device.as_ref());
            let minute = crate::scoring::minute_of(event.ts_ms);
            anomalies.extend(self.scoring.observe(&keys, minute, event.status == 429));
            if shared {
                for key in keys {
                    *counts.entry(((*key).clone(), minute)).or_default() += 1;
                }
            }
        }
        if shared {
            let merged = self
                .scoring
                .merge_counts(counts.into_iter().collect())
                .await?;
            anomalies.extend(merged);
        }
        let found = anomalies.len();
        self.scoring.handle_anomalies(anomalies).await?;
        Ok(RequestsOutcome {
            accepted: events.len(),
            duplicate: false,
            anomalies: found,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: Limits = Limits {
        ids: crate::model::Identifiers {
            accounts: crate::model::AccountIds::CaseInsensitive,
            max_len: 16,
        },
        ipv6_prefix_len: 64,
    };

    #[test]
    fn bad_events_are_reported_by_index() {
        let now = 1_800_000_000_000;
        let batch = vec![
            json!({"ip": "192.0.2.1", "endpoint": "/feed", "status": 200}),
            json!({"ip": "192.0.2.1", "endpoint": "feed", "status": 200}),
            json!({"ip": "192.0.2.1", "endpoint": "/feed", "status": 42}),
            json!({"ip": "192.0.2.1", "endpoint": "/feed", "status": 200, "user_id": "x".repeat(17)}),
            json!({"ip": "192.0.2.1", "endpoint": "/feed", "status": 200, "extra": 1}),
        ];
        let errors = parse_request_batch(&batch, now, LIMITS).unwrap_err();
        let indexes: Vec<usize> = errors.iter().map(|e| e.index).collect();
        assert_eq!(indexes, vec![1, 2, 3, 4]);
        let ok = parse_request_batch(&batch[..1], now, LIMITS).unwrap();
        assert_eq!(ok[0].ts_ms, now);
        assert_eq!(ok[0].status, 200);
    }
}
