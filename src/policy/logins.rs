//! Login replay's inputs and answer.
//!
//! The stored auth events of a window, and what the live and a candidate `[lockout]` do with
//! them. The replay itself builds whole in-process instances, so it stands above the wiring:
//! `crate::login_replay`.

use serde::Serialize;

/// One stored auth event as the replay reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// The auth service's id.
    pub event_id: String,
    /// `login_failure`, `login_success` or `challenge_passed`.
    pub kind: String,
    /// The account as received.
    pub account: String,
    /// Client address.
    pub ip: String,
    /// Device.
    pub device_id: Option<String>,
    /// Endpoint.
    pub endpoint: Option<String>,
    /// Event time, Unix ms.
    pub ts_ms: i64,
    /// Receipt time, Unix ms (windows count by receipt).
    pub received_ms: i64,
}

/// What each policy does with the logins.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoginReport {
    /// Events replayed.
    pub events: u64,
    /// Accounts the live policy locks.
    pub locked_live: u64,
    /// Accounts the candidate locks.
    pub locked_candidate: u64,
    /// Accounts only the candidate locks (at most 100 named).
    pub newly_locked: Vec<String>,
    /// Accounts only the live policy locks (at most 100 named).
    pub no_longer_locked: Vec<String>,
    /// Successful logins the live policy would have refused first (its status was lockout).
    pub successes_refused_live: u64,
    /// Successful logins the candidate would have refused first: honest users it would hurt.
    pub successes_refused_candidate: u64,
}

type Row = (
    String,
    String,
    String,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    i64,
    i64,
);

/// Stored auth events received from `from_ms` to before `to_ms`, by receipt (at most
/// `limit`).
pub async fn read(
    durable: &crate::store::Durable,
    from_ms: i64,
    to_ms: i64,
    limit: u32,
) -> Result<Vec<StoredEvent>, crate::store::Error> {
    let rows: Vec<Row> = crate::store::with_pool!(durable, |pool| sqlx::query_as(
        "SELECT event_id, kind, account, account_received, ip, device_id, endpoint, ts, \
         received_at FROM auth_events WHERE received_at >= $1 AND received_at < $2 \
         ORDER BY received_at, ts, event_id LIMIT $3"
    )
    .bind(from_ms)
    .bind(to_ms)
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await)?;
    Ok(rows
        .into_iter()
        .map(
            |(event_id, kind, account, received, ip, device_id, endpoint, ts_ms, received_ms)| {
                StoredEvent {
                    event_id,
                    kind,
                    account: received.unwrap_or(account),
                    ip,
                    device_id,
                    endpoint,
                    ts_ms,
                    received_ms,
                }
            },
        )
        .collect())
}
