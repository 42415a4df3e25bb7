//! Data-subject requests: everything stored about one account, exported as JSON or erased.
//!
//! Export reads every table that names the account (auth events, lockouts and the events
//! behind them, decision history, alerts, stored factors, list entries, audit entries).
//! Erasure deletes the account's rows in one transaction (list entries excepted: an allow or
//! deny entry is a security decision an operator removes deliberately), and rewrites the
//! account's name in audit entries to its pseudonym; the hot side (lock markers, windows,
//! known contexts, factors) is cleared by `lockout::Lockouts::forget`.

use serde::Serialize;

use crate::clock::rfc3339;
use crate::store::with_pool;
use crate::store::{Durable, Error};

/// Everything stored about an account.
#[derive(Debug, Clone, Serialize)]
pub struct Export {
    /// The account (canonical id).
    pub account: String,
    /// Auth events about it.
    pub auth_events: Vec<serde_json::Value>,
    /// Its lockouts, each with the ids of the events that caused it.
    pub lockouts: Vec<serde_json::Value>,
    /// Refused and challenged limit checks of its user key.
    pub decision_history: Vec<serde_json::Value>,
    /// Alerts about it.
    pub alerts: Vec<serde_json::Value>,
    /// Stored scoring factors of its user key.
    pub factors: Vec<serde_json::Value>,
    /// Allow/deny entries naming it.
    pub list_entries: Vec<serde_json::Value>,
    /// Audit entries about it.
    pub audit: Vec<serde_json::Value>,
}

/// What an erasure deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Erased {
    /// Auth events.
    pub auth_events: u64,
    /// Lockouts (with their event links).
    pub lockouts: u64,
    /// Decision-history entries.
    pub decision_history: u64,
    /// Alerts (with their webhook deliveries).
    pub alerts: u64,
    /// Stored factors.
    pub factors: u64,
    /// Audit entries whose mention of the account now names its pseudonym.
    pub audit_pseudonymised: u64,
    /// Allow/deny entries naming the account, kept (remove them through the lists API).
    pub list_entries_kept: u64,
}

type EventRow = (
    String,
    String,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    i64,
    i64,
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
type HistoryRow = (
    String,
    i64,
    i64,
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    String,
);
type EntryRow = (String, String, String, i64, Option<i64>, Option<i64>);
type AuditRow = (String, i64, String, String, String, String, String);

/// The `LIKE` pattern of audit details that may name `account` (a superset; the exact test
/// is made on the parsed JSON).
fn details_pattern(account: &str) -> String {
    let quoted = serde_json::Value::String(account.to_owned()).to_string();
    format!("%{quoted}%")
}

/// True when any string in `value` is `account`.
fn names(value: &serde_json::Value, account: &str) -> bool {
    match value {
        serde_json::Value::String(s) => s == account,
        serde_json::Value::Array(items) => items.iter().any(|v| names(v, account)),
        serde_json::Value::Object(map) => map.values().any(|v| names(v, account)),
        _ => false,
    }
}

/// `value` with every string equal to `account` replaced by `pseudonym`.
fn replaced(value: serde_json::Value, account: &str, pseudonym: &str) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) if s == account => Value::String(pseudonym.to_owned()),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| replaced(v, account, pseudonym))
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, replaced(v, account, pseudonym)))
                .collect(),
        ),
        other => other,
    }
}

/// Audit entries about the account: its user key as target, one of its lockouts as target,
/// or its name in the details.
async fn audit_rows(
    durable: &Durable,
    account: &str,
    user_key: &str,
) -> Result<Vec<AuditRow>, Error> {
    let rows: Vec<AuditRow> = with_pool!(durable, |pool| {
        sqlx::query_as(
        "SELECT id, at, actor_name, actor_role, action, target, details FROM audit_log \
         WHERE target = $1 OR target = $2 OR target IN (SELECT id FROM lockouts WHERE account = $2) \
         OR details LIKE $3 ORDER BY id"
    )
    .bind(user_key)
    .bind(account)
    .bind(details_pattern(account))
    .fetch_all(pool)
    .await
    })?;
    let lockouts: Vec<String> = with_pool!(durable, |pool| sqlx::query_scalar(
        "SELECT id FROM lockouts WHERE account = $1"
    )
    .bind(account)
    .fetch_all(pool)
    .await)?;
    Ok(rows
        .into_iter()
        .filter(|(_, _, _, _, _, target, details)| {
            target == user_key
                || target == account
                || lockouts.contains(target)
                || serde_json::from_str::<serde_json::Value>(details)
                    .is_ok_and(|d| names(&d, account))
        })
        .collect())
}

/// Everything stored about `account` (`user_key` its subject key).
pub async fn export(durable: &Durable, account: &str, user_key: &str) -> Result<Export, Error> {
    let events: Vec<EventRow> = with_pool!(durable, |pool| sqlx::query_as(
        "SELECT event_id, kind, account_received, ip, device_id, endpoint, ts, received_at \
         FROM auth_events WHERE account = $1 ORDER BY ts, event_id"
    )
    .bind(account)
    .fetch_all(pool)
    .await)?;
    let lockouts: Vec<LockoutRow> = with_pool!(durable, |pool| sqlx::query_as(
        "SELECT id, reason, failures, level, created_at, locked_until, released_at, \
         released_by, release_reason FROM lockouts WHERE account = $1 ORDER BY id"
    )
    .bind(account)
    .fetch_all(pool)
    .await)?;
    let links: Vec<(String, String)> = with_pool!(durable, |pool| sqlx::query_as(
        "SELECT le.lockout_id, le.event_id FROM lockout_events le \
         JOIN lockouts l ON l.id = le.lockout_id WHERE l.account = $1 ORDER BY le.event_id"
    )
    .bind(account)
    .fetch_all(pool)
    .await)?;
    let history: Vec<HistoryRow> = with_pool!(durable, |pool| sqlx::query_as(
        "SELECT id, first_at, last_at, count, class, outcome, reason, ip, device_key, \
         explanation FROM decision_history WHERE user_key = $1 ORDER BY id"
    )
    .bind(user_key)
    .fetch_all(pool)
    .await)?;
    let alerts: Vec<(String, String, String, String, i64)> = with_pool!(durable, |pool| {
        sqlx::query_as(
            "SELECT id, kind, message, details, created_at FROM alerts WHERE subject = $1 ORDER BY id"
        )
        .bind(user_key)
        .fetch_all(pool)
        .await
    })?;
    let factors: Vec<(String, String)> = with_pool!(durable, |pool| sqlx::query_as(
        "SELECT id, body FROM factors WHERE subject = $1 ORDER BY id"
    )
    .bind(user_key)
    .fetch_all(pool)
    .await)?;
    let entries: Vec<EntryRow> = with_pool!(durable, |pool| sqlx::query_as(
        "SELECT id, list, reason, created_at, expires_at, deleted_at FROM list_entries \
             WHERE kind = 'account' AND value = $1 ORDER BY id"
    )
    .bind(account)
    .fetch_all(pool)
    .await)?;
    let audit = audit_rows(durable, account, user_key).await?;

    let json = |text: &str| serde_json::from_str(text).unwrap_or(serde_json::Value::Null);
    Ok(Export {
        account: account.to_owned(),
        auth_events: events
            .into_iter()
            .map(|(id, kind, received, ip, device, endpoint, ts, at)| {
                serde_json::json!({
                    "event_id": id, "type": kind, "account_received": received, "ip": ip,
                    "device_id": device, "endpoint": endpoint, "ts": rfc3339(ts),
                    "received_at": rfc3339(at),
                })
            })
            .collect(),
        lockouts: lockouts
            .into_iter()
            .map(
                |(id, reason, failures, level, created, until, released, by, why)| {
                    let events: Vec<&str> = links
                        .iter()
                        .filter(|(lockout, _)| *lockout == id)
                        .map(|(_, event)| event.as_str())
                        .collect();
                    serde_json::json!({
                        "id": id, "reason": reason, "failures": failures, "level": level,
                        "created_at": rfc3339(created), "locked_until": rfc3339(until),
                        "released_at": released.map(rfc3339), "released_by": by,
                        "release_reason": why, "event_ids": events,
                    })
                },
            )
            .collect(),
        decision_history: history
            .into_iter()
            .map(
                |(id, first, last, count, class, outcome, reason, ip, device, explanation)| {
                    serde_json::json!({
                        "id": id, "first_at": rfc3339(first), "last_at": rfc3339(last),
                        "count": count, "class": class, "outcome": outcome, "reason": reason,
                        "ip": ip, "device_key": device, "explanation": json(&explanation),
                    })
                },
            )
            .collect(),
        alerts: alerts
            .into_iter()
            .map(|(id, kind, message, details, created)| {
                serde_json::json!({
                    "id": id, "kind": kind, "message": message, "details": json(&details),
                    "created_at": rfc3339(created),
                })
            })
            .collect(),
        factors: factors
            .into_iter()
            .map(|(id, body)| serde_json::json!({ "id": id, "factor": json(&body) }))
            .collect(),
        list_entries: entries
            .into_iter()
            .map(|(id, list, reason, created, expires, deleted)| {
                serde_json::json!({
                    "id": id, "list": list, "reason": reason, "created_at": rfc3339(created),
                    "expires_at": expires.map(rfc3339), "deleted_at": deleted.map(rfc3339),
                })
            })
            .collect(),
        audit: audit
            .into_iter()
            .map(|(id, at, actor, role, action, target, details)| {
                serde_json::json!({
                    "id": id, "at": rfc3339(at), "actor": {"name": actor, "role": role},
                    "action": action, "target": target, "details": json(&details),
                })
            })
            .collect(),
    })
}

/// Deletes the account's rows in one transaction and names it by `pseudonym` in the audit
/// entries about it.
pub async fn erase(
    durable: &Durable,
    account: &str,
    user_key: &str,
    pseudonym: &str,
) -> Result<Erased, Error> {
    let audit = audit_rows(durable, account, user_key).await?;
    let pseudonym_key = format!("user:{pseudonym}");
    let rewrites: Vec<(String, String, String)> = audit
        .into_iter()
        .map(|(id, _, _, _, _, target, details)| {
            let target = if target == user_key {
                pseudonym_key.clone()
            } else if target == account {
                pseudonym.to_owned()
            } else {
                target
            };
            let details = serde_json::from_str::<serde_json::Value>(&details)
                .map(|d| replaced(d, account, pseudonym).to_string())
                .unwrap_or(details);
            (id, target, details)
        })
        .collect();
    let list_entries_kept: i64 = with_pool!(durable, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM list_entries WHERE kind = 'account' AND value = $1"
    )
    .bind(account)
    .fetch_one(pool)
    .await)?;
    let counts = with_pool!(durable, |pool| async {
        let mut tx = pool.begin().await?;
        // In order: links before lockouts, deliveries before alerts.
        let steps: [(&str, &str); 7] = [
            (
                "DELETE FROM lockout_events WHERE lockout_id IN \
                 (SELECT id FROM lockouts WHERE account = $1)",
                account,
            ),
            ("DELETE FROM lockouts WHERE account = $1", account),
            ("DELETE FROM auth_events WHERE account = $1", account),
            ("DELETE FROM decision_history WHERE user_key = $1", user_key),
            (
                "DELETE FROM alert_deliveries WHERE alert_id IN \
                 (SELECT id FROM alerts WHERE subject = $1)",
                user_key,
            ),
            ("DELETE FROM alerts WHERE subject = $1", user_key),
            ("DELETE FROM factors WHERE subject = $1", user_key),
        ];
        let mut n = [0u64; 7];
        for (count, (sql, bind)) in n.iter_mut().zip(steps) {
            *count = sqlx::query(sql)
                .bind(bind)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        let [
            _,
            lockouts,
            auth_events,
            decision_history,
            _,
            alerts,
            factors,
        ] = n;
        for (id, target, details) in &rewrites {
            sqlx::query("UPDATE audit_log SET target = $2, details = $3 WHERE id = $1")
                .bind(id)
                .bind(target)
                .bind(details)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>(Erased {
            auth_events,
            lockouts,
            decision_history,
            alerts,
            factors,
            audit_pseudonymised: rewrites.len() as u64,
            list_entries_kept: u64::try_from(list_entries_kept).unwrap_or(0),
        })
    }
    .await)?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_is_replaced_wherever_it_is_a_whole_string() {
        let details = serde_json::json!({
            "account": "alice", "reason": "alice called", "filter": {"account": "alice"},
            "released": ["01A", "alice"],
        });
        assert!(names(&details, "alice"));
        assert!(!names(&details, "ali"));
        let out = replaced(details, "alice", "anon-1");
        assert_eq!(
            out,
            serde_json::json!({
                "account": "anon-1", "reason": "alice called", "filter": {"account": "anon-1"},
                "released": ["01A", "anon-1"],
            })
        );
    }
}
