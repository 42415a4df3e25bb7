//! What analysts read across domains: failing accounts and one account's timeline.
//!
//! Failing accounts are those with failed logins, locked or not yet; a timeline holds an
//! account's auth events, lockouts, releases, alerts and the audited actions on it, newest
//! first.
//!
//! Read-only SQL over tables other domains own and write (`auth_events` of `ingest`,
//! `lockouts` of `lockout`, `alerts` of `scoring`, `audit_log` of `audit`); the HTTP edge
//! shapes it in `api::analyst`. [`history`] keeps refused and challenged limit checks.

pub mod history;
mod store;
pub use store::{AuthEvent, EventQuery};
pub mod subject;

use std::sync::Arc;

use serde::Serialize;

use crate::clock::Clock;
use crate::store::{Durable, Error};

/// An account with failed logins in a period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failing {
    /// The account (canonical id).
    pub account: String,
    /// Failures in the period (matching the filter).
    pub failures: u32,
    /// Distinct addresses they came from.
    pub ips: u32,
    /// Distinct devices they named.
    pub devices: u32,
    /// The first failure's time, Unix ms.
    pub first_ms: i64,
    /// The last failure's time, Unix ms.
    pub last_ms: i64,
    /// The lockout in force on the account, if any.
    pub lockout_id: Option<String>,
}

/// Which failing accounts to list.
#[derive(Debug, Clone, Default)]
pub struct FailingQuery {
    /// Failures at or after this Unix ms (event time, which the events' time index serves).
    pub since_ms: i64,
    /// Only failures from these addresses (a searched network, resolved).
    pub ips: Option<Vec<String>>,
    /// Only failures naming this device.
    pub device_id: Option<String>,
    /// Only accounts with (`true`) or without (`false`) a lockout in force.
    pub locked: Option<bool>,
    /// At most this many accounts (the most failures first).
    pub limit: u32,
}

/// One thing that happened to an account.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineItem {
    /// Unix ms.
    pub at_ms: i64,
    /// `login_failure`, `login_success`, `lockout`, `release`, `alert`, or the audited
    /// action (`penalty.clear`, …).
    pub kind: String,
    /// A sentence for the analyst.
    pub summary: String,
    /// The id of what it refers to (event, lockout, alert, audit entry).
    pub reference: String,
    /// The facts behind it.
    pub details: serde_json::Value,
}

/// A window of a timeline, newest first.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// The items.
    pub items: Vec<TimelineItem>,
    /// Pass as `until` for the older items, when there are more.
    pub next_until_ms: Option<i64>,
}

/// The analyst read service.
#[derive(Debug, Clone)]
pub struct Analyst {
    durable: Durable,
    clock: Arc<dyn Clock>,
}

impl Analyst {
    /// Reads over the durable store.
    pub fn new(durable: Durable, clock: Arc<dyn Clock>) -> Self {
        Self { durable, clock }
    }

    /// Accounts with failures matching `query`, the most failures first.
    pub async fn failing(&self, query: &FailingQuery) -> Result<Vec<Failing>, Error> {
        if query.ips.as_ref().is_some_and(Vec::is_empty) {
            return Ok(Vec::new());
        }
        store::failing(&self.durable, query, self.clock.now_ms()).await
    }

    /// Auth events matching `query`, newest first, and the position after the page's last
    /// (`(ts, event_id)`) when there are more.
    pub async fn events(
        &self,
        query: &EventQuery,
    ) -> Result<(Vec<AuthEvent>, Option<(i64, String)>), Error> {
        if query.ips.as_ref().is_some_and(Vec::is_empty) {
            return Ok((Vec::new(), None));
        }
        let mut rows = store::events(&self.durable, query).await?;
        let limit = query.limit as usize;
        let next = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|r| (r.ts, r.event_id.clone()))
        } else {
            None
        };
        Ok((rows, next))
    }

    /// `account`'s timeline from `since_ms` to before `until_ms`, at most about `limit`
    /// items (items at the same millisecond as the last are never split across pages).
    /// `subject` is the account's subject key (alerts and audit entries name it).
    pub async fn timeline(
        &self,
        account: &str,
        subject: &str,
        since_ms: i64,
        until_ms: i64,
        limit: u32,
    ) -> Result<Timeline, Error> {
        let fetch = i64::from(limit) + 1;
        let mut items =
            store::timeline(&self.durable, account, subject, since_ms, until_ms, fetch).await?;
        // Newest first; at one millisecond a release after the lockout it ends.
        let rank = |i: &TimelineItem| u8::from(i.kind == "release");
        items.sort_by(|a, b| {
            (b.at_ms, rank(b), &b.reference).cmp(&(a.at_ms, rank(a), &a.reference))
        });
        let limit = limit as usize;
        let next_until_ms = if items.len() > limit {
            let last = items[limit - 1].at_ms;
            // Keep the items that share the last one's millisecond: the next page starts
            // strictly before it.
            let keep = items.iter().take_while(|i| i.at_ms >= last).count();
            items.truncate(keep);
            Some(last)
        } else {
            None
        };
        Ok(Timeline {
            items,
            next_until_ms,
        })
    }
}
