//! Where factors and published multipliers live.
//!
//! Redis (`lua/factors_update.lua`, `lua/multiplier_publish.lua`, one slot per subject) or
//! in-process, with the truth of the factors in the durable store ([`durable`]).
//!
//! Per subject: a hash of its stored factors with a version. Deployment-wide, in one slot
//! (`{scoring}`): the due set (subjects whose multiplier changes at a known time), the active
//! index (subjects with published multipliers) and the decision stream.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::Factor;
use crate::model::SubjectKey;
use crate::store::{Error, Hot, Keys};

pub(crate) mod durable;
mod memory;
mod redis;

/// Changes kept in the decision stream.
pub const STREAM_LEN: usize = 100_000;
/// Most subjects returned by one due sweep.
const DUE_BATCH: usize = 256;

/// One change to a subject's stored factors.
#[derive(Debug, Clone)]
pub enum Change {
    /// Insert or replace (by [`Factor::id`]).
    Set(Factor),
    /// Remove by id.
    Delete(String),
}

/// A subject's live stored factors and the version they were read at.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// Bumped by every change.
    pub version: u64,
    /// Live factors, sorted by id.
    pub factors: Vec<Factor>,
}

/// What [`Factors::update`] did.
#[derive(Debug, Clone)]
pub enum Updated {
    /// The subject had nothing stored; the multipliers the caller gave for that case are
    /// published.
    Published,
    /// The live factors, for the caller to publish.
    Stored(Stored),
}

/// A multiplier key and the value to write there (None: delete it).
pub type Write = (String, Option<f64>);

/// One subject's changes for [`Factors::update`], and what to publish if it had nothing
/// stored before (multiplier keys and values, their expiry).
#[derive(Debug, Clone, Copy)]
pub struct Update<'a> {
    /// Whose factors.
    pub subject: &'a SubjectKey,
    /// Applied in order.
    pub changes: &'a [Change],
    /// Multiplier keys and values, and their expiry, for a subject with nothing stored before.
    pub fresh: (&'a [Write], Option<u64>),
}

/// One subject's bookkeeping for [`Factors::record`].
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Whose multipliers were published.
    pub subject: &'a SubjectKey,
    /// `Some(expiry)` while it has published multipliers (`i64::MAX`: no expiry).
    pub active: Option<i64>,
    /// When its multipliers change next by themselves.
    pub due_ms: Option<i64>,
    /// The decision stream entry.
    pub change: &'a DecisionChange,
}

/// One entry of the decision stream: what changed, for enforcers that keep a local copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DecisionChange {
    /// Position in the stream; pass it back as `since`.
    #[serde(default)]
    pub cursor: String,
    /// `multiplier`, `lockout` or `list`.
    pub kind: String,
    /// `set` or `delete`.
    pub action: String,
    /// `ip:…`, `user:…`, `device:…`, `asn:…`; for list entries their value (`203.0.113.0/24`,
    /// `AS64500`, an account or device id).
    pub subject: String,
    /// Per endpoint class, the multiplier now in force (multiplier changes; classes not
    /// listed use the request's default).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<String, f64>,
    /// Unix ms when it stops applying by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// Reason codes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Lockout id or list entry id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// `allow` or `deny` for list entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<String>,
    /// Unix ms of the change.
    pub at_ms: i64,
}

/// A read of the decision stream.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Entries after the cursor asked for, oldest first.
    pub changes: Vec<DecisionChange>,
    /// The cursor to continue from.
    pub next: String,
    /// Entries after the cursor asked for were already trimmed: start again from a snapshot.
    pub reset: bool,
}

/// The factor store of one deployment.
pub type FactorStore = Arc<dyn Factors>;

/// The factor store on `hot`: multipliers go where the limiter reads them.
pub fn open(hot: &Hot) -> FactorStore {
    match hot {
        Hot::Redis(redis) => Arc::new(redis::RedisFactors(redis.clone())),
        Hot::Memory(memory) => Arc::new(memory::MemoryFactors::new(memory.clone())),
    }
}

/// A factor store: the Redis one shared by every instance, or the in-process one.
pub trait Factors: Send + Sync + std::fmt::Debug {
    /// Applies each subject's changes and reads its live factors back, with a new version.
    ///
    /// Each item's `fresh` is what the caller would publish (multiplier keys and values, one
    /// expiry) if the subject had nothing stored before, so that its factors were its
    /// changes' sets alone. On Redis, when that is so, the same call writes it and answers
    /// [`Updated::Published`] (a challenge, one factor on an account with none, is one
    /// call instead of two); the in-process store always answers [`Updated::Stored`]. On a
    /// single Redis a subject that sets one live factor goes in a transaction of plain
    /// commands (`redis::transacted`; read back through the script if it had factors), the others
    /// through the script, `SUBJECTS_PER_CALL` to a call, the calls sent at once; on a
    /// cluster every subject goes through the script, one a call (its keys share one slot).
    fn update<'a>(
        &'a self,
        keys: &'a Keys,
        now_ms: i64,
        items: &'a [Update<'a>],
    ) -> BoxFuture<'a, Result<Vec<Updated>, Error>>;

    /// The live stored factors, without changing anything.
    fn read<'a>(
        &'a self,
        keys: &'a Keys,
        subject: &'a SubjectKey,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<Vec<Factor>, Error>>;

    /// Writes per-class multipliers (`(multiplier key, value or None to delete)`) with one
    /// expiry, unless the subject's factors changed after `version`. True if written.
    fn publish<'a>(
        &'a self,
        keys: &'a Keys,
        subject: &'a SubjectKey,
        version: u64,
        writes: &'a [Write],
        ttl_ms: Option<u64>,
        now_us: u64,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Deployment-wide bookkeeping after publishes, for each subject: the active index
    /// (`Some(expiry)`: has published multipliers until then, `i64::MAX` for none; None: has
    /// none), the due time of its next change, and the stream entry. On Redis one pipeline
    /// (the three keys share the `{scoring}` slot).
    fn record<'a>(
        &'a self,
        keys: &'a Keys,
        records: &'a [Record<'a>],
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Appends entries to the decision stream, in order (on Redis one pipeline).
    fn append_all<'a>(
        &'a self,
        keys: &'a Keys,
        changes: &'a [DecisionChange],
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Stream entries after `cursor` (None: from the newest, i.e. nothing), at most `limit`,
    /// the cursor to continue from, and whether entries after `cursor` were already trimmed.
    fn changes<'a>(
        &'a self,
        keys: &'a Keys,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, Error>>;

    /// Claims the subjects whose multipliers change at or before `now_ms` (each is handed
    /// to one caller only).
    fn take_due<'a>(
        &'a self,
        keys: &'a Keys,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<Vec<SubjectKey>, Error>>;

    /// Subjects with published multipliers that have not expired, at most `limit`.
    fn active<'a>(
        &'a self,
        keys: &'a Keys,
        now_ms: i64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<SubjectKey>, Error>>;

    /// Appends one entry to the decision stream.
    fn append<'a>(
        &'a self,
        keys: &'a Keys,
        change: &'a DecisionChange,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.append_all(keys, std::slice::from_ref(change))
    }
}

/// Stream ids are `<ms>-<seq>` (Redis) or `<seq>` (in-process).
pub fn valid_cursor(cursor: &str) -> bool {
    let mut parts = cursor.splitn(2, '-');
    let first = parts.next().unwrap_or("");
    // Digits only (no sign, no spaces) and within u64, as Redis stream ids are.
    let ok = |p: &str| p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u64>().is_ok();
    ok(first) && parts.next().is_none_or(ok)
}

fn stream_id(cursor: &str) -> (u64, u64) {
    let mut parts = cursor.splitn(2, '-');
    let first = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let second = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (first, second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_stream_ids() {
        assert!(valid_cursor("1700000000000-3"));
        assert!(valid_cursor("42"));
        assert!(!valid_cursor(""));
        assert!(!valid_cursor("1-2-3"));
        assert!(!valid_cursor("abc"));
        assert!(!valid_cursor("-1"));
        assert_eq!(stream_id("17-3"), (17, 3));
    }
}
