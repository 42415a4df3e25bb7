//! A batch of auth events read and checked: each event's lengths, IP, device and timestamp;
//! any bad event rejects the whole batch with every bad index and its reason.

use serde_json::value::RawValue;

use super::{AuthEvent, AuthKind, EventError, Limits, MAX_AGE_MS, MAX_FUTURE_MS, RawAuthEvent};
use crate::lockout::LoginContext;
use crate::model::{ClientIp, SubjectKey};

fn printable(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// An RFC 3339 `ts`, or `now_ms` when absent.
pub(super) fn parse_ts(ts: Option<&str>, now_ms: i64) -> Result<i64, String> {
    match ts {
        None => Ok(now_ms),
        Some(text) => chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| t.timestamp_millis())
            .map_err(|_| format!("ts {text:.40?} is not an RFC 3339 timestamp")),
    }
}

/// A serde error without its position: the position inside one event's text means little to
/// the sender, who gets the event's index.
pub(super) fn reason(err: &serde_json::Error) -> String {
    let text = err.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

fn parse_one(value: &RawValue, now_ms: i64, limits: Limits) -> Result<AuthEvent, String> {
    // Straight from the event's own text: no intermediate `Value` tree (a map and a string
    // per field) to build, clone and drop for each of up to 1000 events.
    let raw: RawAuthEvent = serde_json::from_str(value.get()).map_err(|e| reason(&e))?;
    validate(raw, now_ms, limits)
}

/// A well-formed event checked: lengths, IP, device, timestamp.
fn validate(raw: RawAuthEvent, now_ms: i64, limits: Limits) -> Result<AuthEvent, String> {
    if raw.event_id.is_empty() || raw.event_id.len() > 128 || !printable(&raw.event_id) {
        return Err("event_id must be 1-128 printable characters".to_owned());
    }
    let account_name = limits
        .ids
        .account("account", &raw.account)
        .map_err(|e| e.to_string())?
        .into_owned();
    let account = SubjectKey::user(&account_name, usize::MAX).map_err(|e| e.to_string())?;
    let ip = ClientIp::parse(&raw.ip, limits.ipv6_prefix_len)
        .ok_or_else(|| format!("ip {:.64?} is not an IP address", raw.ip))?;
    let device_id = raw
        .device_id
        .as_deref()
        .map(|d| limits.ids.device(d).map(str::to_owned))
        .transpose()
        .map_err(|e| e.to_string())?;
    let device = device_id
        .as_deref()
        .map(|d| SubjectKey::device(d, usize::MAX))
        .transpose()
        .map_err(|e| e.to_string())?;
    if raw.endpoint.as_ref().is_some_and(|e| e.len() > 2048) {
        return Err("endpoint is longer than 2048 bytes".to_owned());
    }
    match (raw.kind, &raw.challenge_id) {
        (AuthKind::ChallengePassed, None) => {
            return Err(
                "challenge_passed needs the challenge_id of the limit check's challenge".to_owned(),
            );
        }
        (AuthKind::ChallengePassed, Some(id)) if !crate::lockout::challenge_id_valid(id) => {
            return Err(format!("challenge_id {id:.40?} is not a challenge id"));
        }
        (AuthKind::LoginFailure | AuthKind::LoginSuccess, Some(_)) => {
            return Err("challenge_id belongs to challenge_passed events only".to_owned());
        }
        _ => {}
    }
    let ts_ms = parse_ts(raw.ts.as_deref(), now_ms)?;
    if ts_ms < now_ms - MAX_AGE_MS {
        return Err("ts is more than 24 h in the past".to_owned());
    }
    if ts_ms > now_ms + MAX_FUTURE_MS {
        return Err("ts is more than 5 min in the future".to_owned());
    }
    Ok(AuthEvent {
        event_id: raw.event_id,
        kind: raw.kind,
        account_received: (account_name != raw.account).then_some(raw.account),
        context: LoginContext {
            account,
            account_name,
            ip_key: SubjectKey::ip(&ip),
            ip,
            device,
        },
        device_id,
        endpoint: raw.endpoint,
        ts_given: raw.ts.is_some(),
        ts_ms,
        challenge_id: raw.challenge_id,
    })
}

/// Validates a batch parsed in one pass ([`RawAuthBatch`]: every event was well-formed);
/// any bad event rejects the whole batch with every bad index and reason, as
/// [`parse_auth_batch`] does.
pub fn validate_auth_batch(
    events: Vec<RawAuthEvent>,
    now_ms: i64,
    limits: Limits,
) -> Result<Vec<AuthEvent>, Vec<EventError>> {
    gather(events.into_iter().map(|raw| validate(raw, now_ms, limits)))
}

/// Parses a batch event by event; any bad event rejects the whole batch with every bad index
/// and reason (a malformed event included, which a one-pass parse cannot place).
pub fn parse_auth_batch(
    values: &[Box<RawValue>],
    now_ms: i64,
    limits: Limits,
) -> Result<Vec<AuthEvent>, Vec<EventError>> {
    gather(values.iter().map(|value| parse_one(value, now_ms, limits)))
}

/// The events, or every bad one's index and reason.
fn gather(
    results: impl ExactSizeIterator<Item = Result<AuthEvent, String>>,
) -> Result<Vec<AuthEvent>, Vec<EventError>> {
    let mut events = Vec::with_capacity(results.len());
    let mut errors = Vec::new();
    for (index, result) in results.enumerate() {
        match result {
            Ok(event) => events.push(event),
            Err(reason) => errors.push(EventError { index, reason }),
        }
    }
    if errors.is_empty() {
        Ok(events)
    } else {
        Err(errors)
    }
}
