//! Changes made in another region, applied to this region's hot store.
//!
//! Postgres announces every change of a lockout, a stored factor or a list entry on the
//! channel `palisade_changes` when it commits (`migrations/postgres/0018_regions.sql`). Each
//! instance listens; what another region wrote is applied here by reading the durable truth
//! again and making the hot side match it ([`crate::lockout::Lockouts::sync_account`],
//! [`crate::scoring::Engine::sync_subject`], the lists' version). Applying is idempotent,
//! so every instance of a region may apply the same change.
//!
//! A notification is lost while the listening connection is down: when it comes back (and
//! at start), the lockouts in force, the stored factors and the releases since the last
//! connection are put back in full ([`Changes::reconcile`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sqlx::postgres::{PgListener, PgPool};

use crate::clock::Clock;
use crate::lockout::{Error, Lockouts};
use crate::scoring::Engine;
use crate::store::{Hot, Keys};
use crate::telemetry::metrics as names;

/// The channel the database announces changes on.
pub const CHANNEL: &str = "palisade_changes";

/// Notifications applied at once.
const BATCH: usize = 256;

/// One announced change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub struct Announced {
    /// The table: `lockouts`, `factors` or `list_entries`.
    #[serde(rename = "t")]
    pub table: String,
    /// The account (lockouts) or subject (factors); empty for list entries.
    #[serde(rename = "k")]
    pub key: String,
    /// The writer's `application_name`: `palisade/<region>`.
    #[serde(rename = "r")]
    pub writer: String,
}

/// Applies other regions' changes to this region's hot store.
#[derive(Debug)]
pub struct Changes {
    pool: PgPool,
    /// `palisade/<region>`: what this region's own writes are signed with.
    own: String,
    lockouts: Arc<Lockouts>,
    scoring: Arc<Engine>,
    hot: Hot,
    keys: Keys,
    clock: Arc<dyn Clock>,
}

impl Changes {
    /// The changes of the regions other than `region`, applied through these domains.
    pub fn new(
        pool: PgPool,
        region: &str,
        lockouts: Arc<Lockouts>,
        scoring: Arc<Engine>,
        hot: Hot,
        keys: Keys,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            pool,
            own: format!("palisade/{region}"),
            lockouts,
            scoring,
            hot,
            keys,
            clock,
        }
    }

    /// Applies a batch of announcements (once per distinct change; this region's own are
    /// skipped). Returns how many were applied.
    pub async fn apply(&self, batch: &[Announced]) -> usize {
        let distinct: BTreeSet<&Announced> =
            batch.iter().filter(|a| a.writer != self.own).collect();
        let mut lists = false;
        let mut applied = 0;
        let work = distinct.iter().filter_map(|change| {
            if change.table == "list_entries" {
                lists = true;
                return None;
            }
            Some(async move { (change, self.apply_one(change).await) })
        });
        let results = futures_util::future::join_all(work.collect::<Vec<_>>()).await;
        for (change, result) in results {
            match result {
                Ok(()) => {
                    applied += 1;
                    metrics::counter!(names::REGION_CHANGES_TOTAL, "kind" => change.table.clone())
                        .increment(1);
                }
                Err(error) => tracing::warn!(
                    error.cause = %error,
                    change.table = %change.table,
                    "a change from another region could not be applied; the next reconcile puts it back"
                ),
            }
        }
        if lists {
            match self.lists_changed().await {
                Ok(()) => {
                    applied += 1;
                    metrics::counter!(names::REGION_CHANGES_TOTAL, "kind" => "list_entries")
                        .increment(1);
                }
                Err(error) => {
                    tracing::warn!(error.cause = %error, "the lists' change from another region could not be announced here")
                }
            }
        }
        applied
    }

    async fn apply_one(&self, change: &Announced) -> Result<(), Error> {
        match change.table.as_str() {
            "lockouts" => self.lockouts.sync_account(&change.key).await,
            "factors" => Ok(self.scoring.sync_subject(&change.key).await?),
            _ => Ok(()),
        }
    }

    /// Every instance of this region reloads its lists (their version moves).
    async fn lists_changed(&self) -> Result<(), Error> {
        if let Hot::Redis(redis) = &self.hot {
            let _: i64 = redis
                .query(redis::cmd("INCR").arg(self.keys.lists_version()))
                .await
                .map_err(Error::Store)?;
        }
        Ok(())
    }

    /// Puts back everything another region may have changed since `since_ms` (notifications
    /// missed while not listening): the markers of the lockouts in force, the accounts
    /// released since, every live stored factor, and the lists.
    pub async fn reconcile(&self, since_ms: i64) -> Result<(), Error> {
        self.lockouts.restore_markers().await?;
        let released = self.lockouts.released_since(since_ms).await?;
        for account in released.keys() {
            self.lockouts.sync_account(account).await?;
        }
        self.scoring.restore().await?;
        self.lists_changed().await?;
        metrics::counter!(names::REGION_CHANGES_TOTAL, "kind" => "reconcile").increment(1);
        Ok(())
    }

    /// Listens until `shutdown` fires: applies what arrives, and reconciles at start and
    /// after every reconnection.
    pub fn spawn(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        tokio::spawn(async move {
            // Reconciled up to here (ms): the next reconcile starts a little before.
            let mut since = 0i64;
            loop {
                let mut listener = match self.listen().await {
                    Ok(listener) => listener,
                    Err(error) => {
                        tracing::warn!(error.cause = %error, "cannot listen for other regions' changes; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                            _ = shutdown.changed() => return,
                        }
                    }
                };
                let connected = self.clock.now_ms();
                if let Err(error) = self.reconcile(since.saturating_sub(60_000)).await {
                    tracing::warn!(error.cause = %error, "reconciling with other regions failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = shutdown.changed() => return,
                    }
                }
                since = connected;
                loop {
                    let first = tokio::select! {
                        received = listener.try_recv() => received,
                        _ = shutdown.changed() => return,
                    };
                    let first = match first {
                        Ok(Some(notification)) => notification,
                        // The connection dropped: notifications may be lost meanwhile.
                        Ok(None) | Err(_) => break,
                    };
                    let mut batch = vec![first];
                    while batch.len() < BATCH {
                        match listener.next_buffered() {
                            Some(more) => batch.push(more),
                            None => break,
                        }
                    }
                    let announced: Vec<Announced> = batch
                        .iter()
                        .filter_map(|n| serde_json::from_str(n.payload()).ok())
                        .collect();
                    self.apply(&announced).await;
                    since = self.clock.now_ms();
                }
                tracing::warn!(
                    "the connection listening for other regions' changes dropped; reconnecting and reconciling"
                );
            }
        });
    }

    async fn listen(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        Ok(listener)
    }
}
