//! Audit log: every analyst and admin action, who did it, when, from which request.
//!
//! Owns the `audit_log` table. [`Audit::record`] is called by the domain that acts (after
//! its change is stored); [`Audit::list`] serves `GET /v1/audit`.

mod store;

use std::sync::Arc;

use serde::Serialize;

use crate::clock::Clock;
use crate::store::{Durable, Error};

/// Who acted: the API token's id, name and role.
#[derive(Debug, Clone, Serialize)]
pub struct Actor {
    /// Token id (`bootstrap` for the configured bootstrap token).
    pub id: String,
    /// Token name, as given at creation.
    pub name: String,
    /// Token role.
    pub role: String,
}

/// One audit entry.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// ULID; also the pagination cursor.
    pub id: String,
    /// When, Unix milliseconds.
    pub at_ms: i64,
    /// Who.
    pub actor: Actor,
    /// What, as `noun.verb`: `token.create`, `token.revoke`, `lockout.release`, …
    pub action: String,
    /// What it was done to (token id, lockout id, list entry id, …).
    pub target: String,
    /// Action-specific facts (never secrets).
    pub details: serde_json::Value,
    /// The request that did it (`X-Request-Id`).
    pub request_id: String,
}

/// A filter and page position for [`Audit::list`].
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only this action.
    pub action: Option<String>,
    /// Only entries older than this entry id (the previous page's `next_cursor`).
    pub before: Option<ulid::Ulid>,
    /// Page size, 1..=500.
    pub limit: u32,
}

/// One page of entries, newest first.
#[derive(Debug, Clone)]
pub struct Page {
    /// The entries.
    pub items: Vec<Entry>,
    /// Cursor for the next (older) page, if there is one.
    pub next_cursor: Option<String>,
}

/// The audit log service.
#[derive(Debug, Clone)]
pub struct Audit {
    durable: Durable,
    clock: Arc<dyn Clock>,
    pseudonyms: crate::telemetry::privacy::Pseudonyms,
}

impl Audit {
    /// Audit log over the durable store.
    pub fn new(
        durable: Durable,
        clock: Arc<dyn Clock>,
        pseudonyms: crate::telemetry::privacy::Pseudonyms,
    ) -> Self {
        Self {
            durable,
            clock,
            pseudonyms,
        }
    }

    /// Stores one entry.
    pub async fn record(
        &self,
        actor: &Actor,
        action: &str,
        target: &str,
        details: serde_json::Value,
        request_id: &str,
    ) -> Result<Entry, Error> {
        let entry = Entry {
            id: self.clock.new_id().to_string(),
            at_ms: self.clock.now_ms(),
            actor: actor.clone(),
            action: action.to_owned(),
            target: target.to_owned(),
            details,
            request_id: request_id.to_owned(),
        };
        store::insert(&self.durable, &entry).await?;
        let target = self.pseudonyms.shown_key(&entry.target);
        tracing::info!(
            audit.action = %entry.action,
            audit.target = %target,
            actor.name = %entry.actor.name,
            "audited {} on {target} by {}", entry.action, entry.actor.name
        );
        Ok(entry)
    }

    /// Entries matching `query`, newest first.
    pub async fn list(&self, query: &Query) -> Result<Page, Error> {
        let limit = query.limit.clamp(1, 500);
        let mut items = store::list(&self.durable, query, limit + 1).await?;
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|entry| entry.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }
}
