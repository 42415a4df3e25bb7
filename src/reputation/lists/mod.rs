//! Manual allow/deny lists: entries by CIDR, ASN, account or device, stored durably, audited,
//! and applied on every instance.
//!
//! Account, device and single-subject IP entries (an IPv4 address, or an IPv6 prefix of the
//! limiter's IPv6 key length) are published as the subject's multiplier for every class
//! (deny 0, allow 1), so the bucket script enforces them at once. CIDR and ASN entries change
//! `/v1/reputation` answers (allow pins the multiplier at 1 over every range class, deny makes
//! it 0); each instance reloads the live set when the hot-store version counter moves.

mod live;
mod spelling; // an entry's canonical value and the subject it maps to

use live::Live;
pub use spelling::too_broad;

use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use crate::audit::{Actor, Audit};
use crate::clock::Clock;
use crate::model::Identifiers;
use crate::scoring::{DecisionChange, Engine, Factor};
use crate::store::with_pool;
use crate::store::{Durable, Hot, Stores};

/// Which list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListName {
    /// Trusted: multiplier at least 1, over every range class.
    Allow,
    /// Blocked: multiplier 0.
    Deny,
}

impl ListName {
    /// Name in JSON and SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            ListName::Allow => "allow",
            ListName::Deny => "deny",
        }
    }
}

/// What an entry's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// An IP or CIDR.
    Cidr,
    /// An autonomous system (`AS13335` or `13335`).
    Asn,
    /// An account (user id).
    Account,
    /// A device id.
    Device,
}

impl EntryKind {
    fn as_str(self) -> &'static str {
        match self {
            EntryKind::Cidr => "cidr",
            EntryKind::Asn => "asn",
            EntryKind::Account => "account",
            EntryKind::Device => "device",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [
            EntryKind::Cidr,
            EntryKind::Asn,
            EntryKind::Account,
            EntryKind::Device,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// ULID.
    pub id: String,
    /// Its list.
    pub list: ListName,
    /// Its kind.
    pub kind: EntryKind,
    /// Normalised value: canonical CIDR, `AS123`, the account or device id.
    pub value: String,
    /// Why.
    pub reason: String,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Token name that added it.
    pub created_by: String,
    /// Unix ms; absent = until deleted.
    pub expires_at_ms: Option<i64>,
}

/// An entry to add, as given.
#[derive(Debug, Clone)]
pub struct NewEntry {
    /// IP/CIDR, `AS…`, account or device id.
    pub value: String,
    /// Inferred for IPs, CIDRs and `AS…` when absent.
    pub kind: Option<EntryKind>,
    /// Why (1–500 characters).
    pub reason: String,
    /// Unix ms; None = until deleted.
    pub expires_at_ms: Option<i64>,
    /// Accept a CIDR broader than /8 (IPv4) or /16 (IPv6), in either list (an admin's only).
    pub force: bool,
}

/// Why a list operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The value or kind is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// No live entry with this id in this list.
    #[error("no entry with id {0:?} in this list")]
    NotFound(String),
    /// Allowed to an admin only.
    #[error("{0}")]
    Forbidden(String),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

const INSERT: &str = "INSERT INTO list_entries (id, list, kind, value, reason, created_at, created_by, expires_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
const LIVE: &str = "SELECT id, list, kind, value, reason, created_at, created_by, expires_at FROM list_entries \
    WHERE deleted_at IS NULL AND (expires_at IS NULL OR expires_at > $1) ORDER BY id";
const DELETE: &str = "UPDATE list_entries SET deleted_at = $3, deleted_by = $4 \
    WHERE id = $1 AND list = $2 AND deleted_at IS NULL";
const GET: &str = "SELECT id, list, kind, value, reason, created_at, created_by, expires_at FROM list_entries \
    WHERE id = $1 AND list = $2";

const BANS_NEW: &str = "SELECT id, list, kind, value, reason, created_at, created_by, expires_at FROM list_entries \
    WHERE list = 'deny' AND kind = 'cidr' AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > $2) \
    AND created_at > $1 ORDER BY id";
const BANS_GONE: &str = "SELECT id, list, kind, value, reason, created_at, created_by, expires_at FROM list_entries \
    WHERE list = 'deny' AND kind = 'cidr' \
    AND ((deleted_at > $1 AND deleted_at <= $2) OR (expires_at > $1 AND expires_at <= $2)) ORDER BY id";

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    list: String,
    kind: String,
    value: String,
    reason: String,
    created_at: i64,
    created_by: String,
    expires_at: Option<i64>,
}

impl Row {
    fn entry(self) -> Option<Entry> {
        Some(Entry {
            id: self.id,
            list: if self.list == "allow" {
                ListName::Allow
            } else {
                ListName::Deny
            },
            kind: EntryKind::parse(&self.kind)?,
            value: self.value,
            reason: self.reason,
            created_at_ms: self.created_at,
            created_by: self.created_by,
            expires_at_ms: self.expires_at,
        })
    }
}

/// The lists service.
#[derive(Debug)]
pub struct Lists {
    durable: Durable,
    hot: Hot,
    version_key: String,
    clock: Arc<dyn Clock>,
    /// Weak: the engine holds the lists as a signal; a strong link both ways would leak both.
    scoring: std::sync::Weak<Engine>,
    audit: Audit,
    ids: Identifiers,
    ipv6_prefix_len: u8,
    live: ArcSwap<Live>,
    seen_version: std::sync::atomic::AtomicI64,
}

impl Lists {
    /// The service; call [`Lists::refresh`] once before use. `scoring` republishes the
    /// subjects an entry names.
    pub fn new(
        stores: &Stores,
        clock: Arc<dyn Clock>,
        scoring: std::sync::Weak<Engine>,
        audit: Audit,
        ids: Identifiers,
        ipv6_prefix_len: u8,
    ) -> Self {
        Self {
            durable: stores.durable.clone(),
            hot: stores.hot.clone(),
            version_key: stores.keys.lists_version(),
            clock,
            scoring,
            audit,
            ids,
            ipv6_prefix_len,
            live: ArcSwap::from_pointee(Live::default()),
            seen_version: std::sync::atomic::AtomicI64::new(-1),
        }
    }

    /// Adds an entry; audited as `list.add`.
    pub async fn add(
        &self,
        list: ListName,
        new: NewEntry,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Entry, Error> {
        let NewEntry {
            value,
            kind,
            reason,
            expires_at_ms,
            force,
        } = new;
        let (kind, value) = self.normalize(&value, kind)?;
        let broad = kind == EntryKind::Cidr && too_broad(&value);
        if broad {
            let effect = match list {
                ListName::Allow => "allowing it lifts reputation penalties for",
                ListName::Deny => "denying it refuses every request from",
            };
            if !force {
                return Err(Error::Invalid(format!(
                    "{value} is broader than /8 (IPv4) or /16 (IPv6): {effect} a large part of \
                     the internet; an admin may send force = true if that is meant"
                )));
            }
            if actor.role != crate::access::Role::Admin.as_str() {
                return Err(Error::Forbidden(format!(
                    "{value} is broader than /8 (IPv4) or /16 (IPv6): only an admin may force it"
                )));
            }
        }
        let reason = crate::model::free_text(&reason, 500)
            .map_err(|problem| Error::Invalid(format!("reason {problem}")))?;
        let now = self.clock.now_ms();
        // The lookup index numbers entries with u16; more would be silently ignored.
        if self.live.load().entries.len() >= usize::from(u16::MAX) {
            return Err(Error::Invalid(format!(
                "the lists hold at most {} live entries; delete some or use wider CIDRs",
                u16::MAX
            )));
        }
        if expires_at_ms.is_some_and(|at| at <= now) {
            return Err(Error::Invalid("expires_at is in the past".to_owned()));
        }
        let entry = Entry {
            id: self.clock.new_id().to_string(),
            list,
            kind,
            value,
            reason: reason.to_owned(),
            created_at_ms: now,
            created_by: actor.name.clone(),
            expires_at_ms,
        };
        with_pool!(&self.durable, |pool| sqlx::query(INSERT)
            .bind(&entry.id)
            .bind(list.as_str())
            .bind(kind.as_str())
            .bind(&entry.value)
            .bind(&entry.reason)
            .bind(entry.created_at_ms)
            .bind(&entry.created_by)
            .bind(entry.expires_at_ms)
            .execute(pool)
            .await
            .map(|_| ()))
        .map_err(crate::store::Error::from)?;
        self.changed().await?;
        self.announce(&entry, "set").await?;
        self.audit
            .record(actor, "list.add", &entry.id, serde_json::json!({ "list": list, "kind": kind, "value": entry.value, "reason": entry.reason, "forced": broad }), request_id)
            .await?;
        Ok(entry)
    }

    /// Deletes an entry; audited as `list.delete`.
    pub async fn delete(
        &self,
        list: ListName,
        id: &str,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Entry, Error> {
        let now = self.clock.now_ms();
        let deleted = with_pool!(&self.durable, |pool| sqlx::query(DELETE)
            .bind(id)
            .bind(list.as_str())
            .bind(now)
            .bind(&actor.name)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))
        .map_err(crate::store::Error::from)?;
        if deleted == 0 {
            return Err(Error::NotFound(id.to_owned()));
        }
        let row: Option<Row> = with_pool!(&self.durable, |pool| sqlx::query_as(GET)
            .bind(id)
            .bind(list.as_str())
            .fetch_optional(pool)
            .await)
        .map_err(crate::store::Error::from)?;
        let entry = row
            .and_then(Row::entry)
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        self.changed().await?;
        self.announce(&entry, "delete").await?;
        self.audit
            .record(
                actor,
                "list.delete",
                id,
                serde_json::json!({ "list": list, "value": entry.value, "reason": reason }),
                request_id,
            )
            .await?;
        Ok(entry)
    }

    /// After a change: the subject an entry names exactly is republished (its stored
    /// factors combine with the new entry), and the change enters the decision stream.
    async fn announce(&self, entry: &Entry, action: &str) -> Result<(), Error> {
        // Only gone while the app shuts down: then there is nothing left to publish to.
        let Some(scoring) = self.scoring.upgrade() else {
            return Ok(());
        };
        if let Some(subject) = self.subject(entry) {
            // Stored, not only pulled: every instance enforces it at once, before its own
            // list refresh.
            let now = self.clock.now_ms();
            let live = self.live.load();
            let hits: Vec<&Entry> = live
                .entries
                .iter()
                .filter(|e| e.expires_at_ms.is_none_or(|at| at > now))
                .filter(|e| self.subject(e).as_ref() == Some(&subject))
                .collect();
            let factors = list_factors(&hits);
            let mut changes: Vec<crate::scoring::Change> = ["list_deny", "list_allow"]
                .iter()
                .filter(|code| !factors.iter().any(|f| f.code == **code))
                .map(|code| crate::scoring::Change::Delete(format!("lists:{code}")))
                .collect();
            changes.extend(factors.into_iter().map(crate::scoring::Change::Set));
            scoring
                .apply(&subject, &changes)
                .await
                .map_err(|e| match e {
                    crate::scoring::Error::Store(store) => Error::Store(store),
                })?;
        }
        scoring
            .record_change(DecisionChange {
                cursor: String::new(),
                kind: "list".to_owned(),
                action: action.to_owned(),
                subject: entry.value.clone(),
                classes: Default::default(),
                expires_at_ms: entry.expires_at_ms,
                reasons: vec![format!("list_{}", entry.list.as_str())],
                reference: Some(entry.id.clone()),
                list: Some(entry.list.as_str().to_owned()),
                at_ms: entry.created_at_ms,
            })
            .await
            .map_err(|e| match e {
                crate::scoring::Error::Store(store) => Error::Store(store),
            })
    }

    /// IP bans for firewall-style enforcers: deny entries of kind `cidr` that became live
    /// after `since_ms` (every live one when None), and those deleted or expired in
    /// `(since_ms, now_ms]`; never one broader than /8 or /16 ([`too_broad`]). Read from the durable store, so every instance answers alike.
    pub async fn ip_bans_since(
        &self,
        since_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<(Vec<Entry>, Vec<Entry>), crate::store::Error> {
        let from = since_ms.unwrap_or(i64::MIN);
        let fetch = |sql: &'static str| async move {
            let rows: Vec<Row> = with_pool!(&self.durable, |pool| sqlx::query_as(sql)
                .bind(from)
                .bind(now_ms)
                .fetch_all(pool)
                .await)?;
            // A ban this broad would make a firewall drop everyone: enforced here, never
            // published.
            Ok::<_, crate::store::Error>(
                rows.into_iter()
                    .filter_map(Row::entry)
                    .filter(|entry| !too_broad(&entry.value))
                    .collect::<Vec<_>>(),
            )
        };
        let new = fetch(BANS_NEW).await?;
        let gone = if since_ms.is_some() {
            fetch(BANS_GONE).await?
        } else {
            Vec::new()
        };
        Ok((new, gone))
    }

    /// Reloads the live entries from the durable store.
    pub async fn refresh(&self) -> Result<(), Error> {
        let rows: Vec<Row> = with_pool!(&self.durable, |pool| sqlx::query_as(LIVE)
            .bind(self.clock.now_ms())
            .fetch_all(pool)
            .await)
        .map_err(crate::store::Error::from)?;
        self.live.store(Arc::new(Live::build(
            rows.into_iter().filter_map(Row::entry).collect(),
            self.ids,
        )));
        if let Some(scoring) = self.scoring.upgrade() {
            scoring.invalidate();
        }
        Ok(())
    }

    async fn changed(&self) -> Result<(), Error> {
        if let Hot::Redis(redis) = &self.hot {
            let version: i64 = redis
                .query(redis::cmd("INCR").arg(&self.version_key))
                .await?;
            self.seen_version
                .store(version, std::sync::atomic::Ordering::SeqCst);
        }
        self.refresh().await
    }

    /// One step of the cross-instance refresh: reload when another instance changed a list.
    pub async fn refresh_if_changed(&self) -> Result<(), Error> {
        if let Hot::Redis(redis) = &self.hot {
            let version: Option<i64> = redis
                .query(redis::cmd("GET").arg(&self.version_key))
                .await?;
            let version = version.unwrap_or(0);
            if self
                .seen_version
                .swap(version, std::sync::atomic::Ordering::SeqCst)
                != version
            {
                self.refresh().await?;
            }
        }
        Ok(())
    }
}

/// The factors of matching entries: deny → 0 (beats allow), allow → pin at 1.
pub(super) fn list_factors(hits: &[&Entry]) -> Vec<Factor> {
    let mut factors = Vec::new();
    for list in [ListName::Deny, ListName::Allow] {
        let matching: Vec<&&Entry> = hits.iter().filter(|e| e.list == list).collect();
        let Some(first) = matching.first() else {
            continue;
        };
        let values: Vec<String> = matching
            .iter()
            .map(|e| format!("{} ({})", e.value, e.reason))
            .collect();
        let code = format!("list_{}", list.as_str());
        let message = format!("{} list: {}", list.as_str(), values.join(", "));
        let mut factor = match list {
            ListName::Deny => Factor::scale("lists", &code, 0.0, message),
            ListName::Allow => Factor::pin("lists", &code, message),
        }
        .referring_to(first.id.clone());
        let expiry = matching.iter().map(|e| e.expires_at_ms).max().flatten();
        if matching.iter().all(|e| e.expires_at_ms.is_some()) {
            factor.expires_at_ms = expiry;
        }
        factors.push(factor);
    }
    factors
}
