//! SQL of the analyst reads (portable between Postgres and SQLite).

use super::{Failing, FailingQuery, TimelineItem};
use crate::clock::rfc3339;
use crate::store::with_pool;
use crate::store::{Durable, Error};

/// `(?, ?, …)`: one bind per item, on either database.
fn push_list<DB: sqlx::Database>(builder: &mut sqlx::QueryBuilder<DB>, items: &[String])
where
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    builder.push("(");
    let mut list = builder.separated(", ");
    for item in items {
        list.push_bind(item.as_str());
    }
    builder.push(")");
}

type FailingRow = (String, i64, i64, i64, i64, i64, Option<String>);

pub(super) async fn failing(
    durable: &Durable,
    query: &FailingQuery,
    now_ms: i64,
) -> Result<Vec<Failing>, Error> {
    let rows: Vec<FailingRow> = with_pool!(durable, |pool| {
        let mut builder = sqlx::QueryBuilder::new(
            "SELECT f.account, f.failures, f.ips, f.devices, f.first_ts, f.last_ts, \
             (SELECT MAX(l.id) FROM lockouts l WHERE l.account = f.account \
               AND l.released_at IS NULL AND l.locked_until > ",
        );
        builder.push_bind(now_ms);
        builder.push(
            ") AS lockout_id FROM (SELECT account, COUNT(*) AS failures, \
             COUNT(DISTINCT ip) AS ips, COUNT(DISTINCT device_id) AS devices, \
             MIN(ts) AS first_ts, MAX(ts) AS last_ts FROM auth_events \
             WHERE kind = 'login_failure' AND ts >= ",
        );
        builder.push_bind(query.since_ms);
        if let Some(ips) = &query.ips {
            builder.push(" AND ip IN ");
            push_list(&mut builder, ips);
        }
        if let Some(device) = &query.device_id {
            builder.push(" AND device_id = ").push_bind(device.as_str());
        }
        builder.push(" GROUP BY account) f");
        if let Some(locked) = query.locked {
            builder.push(if locked {
                " WHERE EXISTS"
            } else {
                " WHERE NOT EXISTS"
            });
            builder.push(
                " (SELECT 1 FROM lockouts l WHERE l.account = f.account \
                 AND l.released_at IS NULL AND l.locked_until > ",
            );
            builder.push_bind(now_ms);
            builder.push(")");
        }
        builder.push(" ORDER BY f.failures DESC, f.account LIMIT ");
        builder.push_bind(i64::from(query.limit));
        builder.build_query_as().fetch_all(pool).await
    })?;
    let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(rows
        .into_iter()
        .map(
            |(account, failures, ips, devices, first_ms, last_ms, lockout_id)| Failing {
                account,
                failures: count(failures),
                ips: count(ips),
                devices: count(devices),
                first_ms,
                last_ms,
                lockout_id,
            },
        )
        .collect())
}

const EVENTS: &str = "SELECT event_id, kind, ip, device_id, endpoint, ts, account_received \
    FROM auth_events WHERE account = $1 AND ts >= $2 AND ts < $3 \
    ORDER BY ts DESC, event_id DESC LIMIT $4";
const LOCKOUTS: &str = "SELECT id, reason, failures, level, created_at, locked_until, \
    released_at, released_by, release_reason FROM lockouts WHERE account = $1 \
    AND ((created_at >= $2 AND created_at < $3) OR (released_at >= $2 AND released_at < $3)) \
    ORDER BY id DESC LIMIT $4";
const ALERTS: &str = "SELECT id, kind, message, details, created_at FROM alerts \
    WHERE subject = $1 AND created_at >= $2 AND created_at < $3 ORDER BY id DESC LIMIT $4";
const DECISIONS: &str = "SELECT id, first_at, last_at, count, class, outcome, reason, ip, \
    explanation FROM decision_history WHERE user_key = $1 AND first_at >= $2 AND first_at < $3 \
    ORDER BY id DESC LIMIT $4";
const AUDIT: &str = "SELECT id, at, actor_name, action, details FROM audit_log \
    WHERE target = $1 AND at >= $2 AND at < $3 ORDER BY id DESC LIMIT $4";

type EventRow = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    i64,
    Option<String>,
);
type LockoutRow = (
    String,
    String,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// Each source's newest `fetch` items in the window, unmerged.
pub(super) async fn timeline(
    durable: &Durable,
    account: &str,
    subject: &str,
    since_ms: i64,
    until_ms: i64,
    fetch: i64,
) -> Result<Vec<TimelineItem>, Error> {
    let events: Vec<EventRow> = with_pool!(durable, |pool| sqlx::query_as(EVENTS)
        .bind(account)
        .bind(since_ms)
        .bind(until_ms)
        .bind(fetch)
        .fetch_all(pool)
        .await)?;
    let lockouts: Vec<LockoutRow> = with_pool!(durable, |pool| sqlx::query_as(LOCKOUTS)
        .bind(account)
        .bind(since_ms)
        .bind(until_ms)
        .bind(fetch)
        .fetch_all(pool)
        .await)?;
    let alerts: Vec<(String, String, String, String, i64)> =
        with_pool!(durable, |pool| sqlx::query_as(ALERTS)
            .bind(subject)
            .bind(since_ms)
            .bind(until_ms)
            .bind(fetch)
            .fetch_all(pool)
            .await)?;
    let audited: Vec<(String, i64, String, String, String)> =
        with_pool!(durable, |pool| sqlx::query_as(AUDIT)
            .bind(subject)
            .bind(since_ms)
            .bind(until_ms)
            .bind(fetch)
            .fetch_all(pool)
            .await)?;

    type DecisionRow = (
        String,
        i64,
        i64,
        i64,
        String,
        String,
        String,
        String,
        String,
    );
    let decisions: Vec<DecisionRow> = with_pool!(durable, |pool| sqlx::query_as(DECISIONS)
        .bind(subject)
        .bind(since_ms)
        .bind(until_ms)
        .bind(fetch)
        .fetch_all(pool)
        .await)?;

    let mut items = Vec::new();
    for (id, first, last, count, class, outcome, reason, ip, explanation) in decisions {
        let what = if outcome == "challenge" {
            "Challenged"
        } else {
            "Refused"
        };
        let times = if count == 1 {
            String::new()
        } else {
            format!(" {count}×")
        };
        let mut details: serde_json::Value =
            serde_json::from_str(&explanation).unwrap_or(serde_json::Value::Null);
        if let Some(object) = details.as_object_mut() {
            object.insert("class".to_owned(), class.clone().into());
            object.insert("reason".to_owned(), reason.clone().into());
            object.insert("count".to_owned(), count.into());
            object.insert("ip".to_owned(), ip.clone().into());
            object.insert("last_at".to_owned(), rfc3339(last).into());
        }
        items.push(TimelineItem {
            at_ms: first,
            kind: format!("decision.{outcome}"),
            summary: format!("{what}{times} on {class} from {ip}: {reason}"),
            reference: id,
            details,
        });
    }
    for (event_id, kind, ip, device_id, endpoint, ts, received) in events {
        let what = match kind.as_str() {
            "login_failure" => "Failed login",
            "challenge_passed" => "Login challenge passed",
            _ => "Successful login",
        };
        let device = device_id
            .as_deref()
            .map(|d| format!(" on device {d}"))
            .unwrap_or_default();
        items.push(TimelineItem {
            at_ms: ts,
            summary: format!("{what} from {ip}{device}"),
            kind,
            reference: event_id,
            details: serde_json::json!({
                "ip": ip,
                "device_id": device_id,
                "endpoint": endpoint,
                "account_received": received,
            }),
        });
    }
    let in_window = |at: i64| at >= since_ms && at < until_ms;
    for (id, reason, failures, level, created, until, released, by, why) in lockouts {
        if in_window(created) {
            items.push(TimelineItem {
                at_ms: created,
                kind: "lockout".to_owned(),
                summary: format!(
                    "Locked until {} ({reason}, {failures} failures, level {level})",
                    rfc3339(until)
                ),
                reference: id.clone(),
                details: serde_json::json!({
                    "reason": reason, "failures": failures, "level": level,
                    "locked_until": rfc3339(until),
                }),
            });
        }
        if let Some(at) = released.filter(|at| in_window(*at)) {
            let by = by.unwrap_or_default();
            let why = why.unwrap_or_default();
            items.push(TimelineItem {
                at_ms: at,
                kind: "release".to_owned(),
                summary: format!("Lockout released by {by}: {why}"),
                reference: id,
                details: serde_json::json!({ "released_by": by, "reason": why }),
            });
        }
    }
    for (id, kind, message, details, created) in alerts {
        items.push(TimelineItem {
            at_ms: created,
            summary: message,
            details: serde_json::from_str(&details).unwrap_or(serde_json::Value::Null),
            kind: format!("alert.{kind}"),
            reference: id,
        });
    }
    for (id, at, actor, action, details) in audited {
        let details: serde_json::Value =
            serde_json::from_str(&details).unwrap_or(serde_json::Value::Null);
        let why = details
            .get("reason")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        items.push(TimelineItem {
            at_ms: at,
            summary: format!("{action} by {actor}: {why}"),
            kind: action,
            reference: id,
            details,
        });
    }
    Ok(items)
}

/// Which auth events to list.
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Only this account.
    pub account: Option<String>,
    /// Only from these addresses (a searched network or ASN, resolved).
    pub ips: Option<Vec<String>>,
    /// Only naming this device.
    pub device_id: Option<String>,
    /// Only `login_failure`, `login_success` or `challenge_passed`.
    pub kind: Option<String>,
    /// Only at or after this Unix ms (event time).
    pub since_ms: Option<i64>,
    /// Only before this Unix ms.
    pub until_ms: Option<i64>,
    /// Only after this `(ts, event_id)` in the order (newest first).
    pub after: Option<(i64, String)>,
    /// Page size.
    pub limit: u32,
}

/// One auth event.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AuthEvent {
    /// The auth service's id.
    pub event_id: String,
    /// `login_failure`, `login_success` or `challenge_passed`.
    pub kind: String,
    /// Canonical account.
    pub account: String,
    /// As received, when different.
    pub account_received: Option<String>,
    /// Address.
    pub ip: String,
    /// Device.
    pub device_id: Option<String>,
    /// Endpoint.
    pub endpoint: Option<String>,
    /// Event time, Unix ms.
    pub ts: i64,
}

/// Auth events matching `query`, newest first (`limit` + 1 of them, to tell a next page).
pub(super) async fn events(durable: &Durable, query: &EventQuery) -> Result<Vec<AuthEvent>, Error> {
    Ok(with_pool!(durable, |pool| {
        let mut builder = sqlx::QueryBuilder::new(
            "SELECT event_id, kind, account, account_received, ip, device_id, endpoint, ts \
             FROM auth_events WHERE 1 = 1",
        );
        if let Some(account) = &query.account {
            builder.push(" AND account = ").push_bind(account.as_str());
        }
        if let Some(ips) = &query.ips {
            builder.push(" AND ip IN ");
            push_list(&mut builder, ips);
        }
        if let Some(device) = &query.device_id {
            builder.push(" AND device_id = ").push_bind(device.as_str());
        }
        if let Some(kind) = &query.kind {
            builder.push(" AND kind = ").push_bind(kind.as_str());
        }
        if let Some(since) = query.since_ms {
            builder.push(" AND ts >= ").push_bind(since);
        }
        if let Some(until) = query.until_ms {
            builder.push(" AND ts < ").push_bind(until);
        }
        if let Some((ts, id)) = &query.after {
            builder
                .push(" AND (ts < ")
                .push_bind(*ts)
                .push(" OR (ts = ")
                .push_bind(*ts)
                .push(" AND event_id < ")
                .push_bind(id.as_str())
                .push("))");
        }
        builder
            .push(" ORDER BY ts DESC, event_id DESC LIMIT ")
            .push_bind(i64::from(query.limit) + 1);
        builder.build_query_as().fetch_all(pool).await
    })?)
}
