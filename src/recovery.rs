//! Redis is a cache, the durable store the truth: noticing that the hot store lost its data
//! and rebuilding its enforcement state from the durable store.
//!
//! The hot store holds an epoch marker ([`crate::store::epoch`]), written when its state is
//! complete. Every instance reads it every second ([`Recovery::check`], also once before
//! serving); gone means the hot store lost its data (a restart without persistence, a failover
//! to an empty replica, `FLUSHALL`, eviction of the marker) or is new. One instance takes the
//! rebuild lease and rebuilds, the others wait for the new epoch; meanwhile classes that fail
//! closed do (as when Redis is down):
//! 1. the lock markers of the lockouts in force (enforcement of lockouts first),
//! 2. every live stored factor, published again (lockouts, escalations, spraying and ASN
//!    blocks, list entries, attestation verdicts, offender and anomaly flags),
//! 3. the new epoch is written (every instance answers normally again), then the velocity
//!    windows and known contexts are replayed from the stored auth events (an attacker gets
//!    no fresh set of attempts because Redis restarted).
//!
//! Token buckets are not rebuilt: they refill to their budgets (a burst of at most one
//! budget per key).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::clock::Clock;
use crate::ingest::Ingest;
use crate::lockout::Lockouts;
use crate::scoring::Engine;
use crate::store::{Hot, Keys, epoch};
use crate::telemetry::metrics as names;

/// How long a rebuild lease lasts: an instance that dies while rebuilding holds it (and the
/// others' fail-closed classes) no longer than this. A rebuild whose lockouts and factors
/// take longer gets a second rebuilder, which is harmless (every step is idempotent).
const LEASE: Duration = Duration::from_secs(30);

/// What a rebuild put back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Rebuilt {
    /// Unix ms when it finished.
    pub at_ms: i64,
    /// How long it took, ms.
    pub took_ms: u64,
    /// How long until the lockouts and factors were back (enforced again), ms; the windows
    /// take the rest.
    pub enforced_ms: u64,
    /// Lockouts in force whose markers were set.
    pub lockouts: u64,
    /// Subjects whose stored factors were published again.
    pub subjects: u64,
    /// Auth events replayed into the windows.
    pub events: u64,
}

/// Where this instance is with the hot store's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Not checked yet.
    Unknown,
    /// The epoch marker is there: the hot store's state is complete.
    Current,
    /// This instance is rebuilding it.
    Rebuilding,
    /// Another instance is rebuilding it.
    Waiting,
}

/// The hot store's state as `/readyz` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HotState {
    /// Where this instance is.
    pub phase: Phase,
    /// Since when (Unix ms), while rebuilding or waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// The epoch in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// This instance's last rebuild.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_rebuild: Option<Rebuilt>,
}

/// Why a check or rebuild failed (the next check tries again).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The hot or durable store.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    /// Restoring lockouts.
    #[error(transparent)]
    Lockout(#[from] crate::lockout::Error),
    /// Restoring factors.
    #[error(transparent)]
    Scoring(#[from] crate::scoring::Error),
    /// Replaying auth events.
    #[error(transparent)]
    Ingest(#[from] crate::ingest::Error),
}

/// The rebuild of one instance.
#[derive(Debug)]
pub struct Recovery {
    hot: Hot,
    keys: Keys,
    clock: Arc<dyn Clock>,
    lockouts: Arc<Lockouts>,
    scoring: Arc<Engine>,
    limiter: Arc<crate::limiter::Limiter>,
    ingest: Ingest,
    ipv6_prefix_len: u8,
    /// This instance's name on the lease.
    owner: String,
    state: Mutex<HotState>,
}

impl Recovery {
    /// The recovery of one instance over these services.
    pub fn new(
        stores: &crate::store::Stores,
        clock: Arc<dyn Clock>,
        lockouts: Arc<Lockouts>,
        scoring: Arc<Engine>,
        limiter: Arc<crate::limiter::Limiter>,
        ingest: Ingest,
        ipv6_prefix_len: u8,
    ) -> Self {
        Self {
            hot: stores.hot.clone(),
            keys: stores.keys.clone(),
            owner: clock.new_id().to_string(),
            clock,
            lockouts,
            scoring,
            limiter,
            ingest,
            ipv6_prefix_len,
            state: Mutex::new(HotState {
                phase: Phase::Unknown,
                since_ms: None,
                epoch: None,
                last_rebuild: None,
            }),
        }
    }

    /// The hot store's state as this instance last saw it.
    pub fn state(&self) -> HotState {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update(&self, change: impl FnOnce(&mut HotState)) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut state);
        // An epoch id is a ULID made when the epoch began: decision-stream cursors from
        // before it are answered with a reset.
        if let Some(began) = state
            .epoch
            .as_deref()
            .and_then(|e| ulid::Ulid::from_string(e).ok())
        {
            self.scoring
                .set_stream_since(i64::try_from(began.timestamp_ms()).unwrap_or(0));
        }
        let rebuilding = matches!(state.phase, Phase::Rebuilding | Phase::Waiting);
        metrics::gauge!(names::HOT_REBUILDING).set(if rebuilding { 1.0 } else { 0.0 });
        // Until lockouts and factors are back, classes that fail closed do.
        self.limiter.set_rebuilding(rebuilding);
    }

    /// Reads the epoch marker; when it is gone, rebuilds the hot store's state (if this
    /// instance wins the lease) or waits for the instance that does. Returns the phase.
    pub async fn check(&self) -> Result<Phase, Error> {
        let now = self.clock.now_ms();
        if let Some(current) = epoch::get(&self.hot, &self.keys, now).await? {
            self.update(|state| {
                state.phase = Phase::Current;
                state.since_ms = None;
                state.epoch = Some(current);
            });
            return Ok(Phase::Current);
        }
        if !epoch::claim(
            &self.hot,
            &self.keys,
            &self.owner,
            now,
            LEASE.as_millis() as i64,
        )
        .await?
        {
            self.update(|state| {
                if state.phase != Phase::Waiting {
                    tracing::warn!(
                        "the hot store holds no epoch marker; another instance is rebuilding it"
                    );
                    state.since_ms = Some(now);
                }
                state.phase = Phase::Waiting;
            });
            return Ok(Phase::Waiting);
        }
        // An instance that rebuilt just before this one took the lease.
        if let Some(current) = epoch::get(&self.hot, &self.keys, now).await? {
            epoch::release(&self.hot, &self.keys, &self.owner, now).await?;
            self.update(|state| {
                state.phase = Phase::Current;
                state.since_ms = None;
                state.epoch = Some(current);
            });
            return Ok(Phase::Current);
        }
        self.update(|state| {
            state.phase = Phase::Rebuilding;
            state.since_ms = Some(now);
        });
        let rebuilt = self.rebuild().await;
        epoch::release(&self.hot, &self.keys, &self.owner, self.clock.now_ms()).await?;
        match rebuilt {
            Ok((rebuilt, epoch)) => {
                metrics::counter!(names::HOT_REBUILDS_TOTAL, "outcome" => "done").increment(1);
                metrics::gauge!(names::HOT_REBUILD_SECONDS).set(rebuilt.took_ms as f64 / 1000.0);
                self.update(|state| {
                    state.phase = Phase::Current;
                    state.since_ms = None;
                    state.epoch = Some(epoch);
                    state.last_rebuild = Some(rebuilt);
                });
                Ok(Phase::Current)
            }
            Err(err) => {
                metrics::counter!(names::HOT_REBUILDS_TOTAL, "outcome" => "failed").increment(1);
                tracing::warn!(error.cause = %err, "rebuilding the hot store failed; will retry");
                Err(err)
            }
        }
    }

    /// Puts the enforcement state back (lockouts, factors, windows) and writes a new epoch.
    async fn rebuild(&self) -> Result<(Rebuilt, String), Error> {
        let started = Instant::now();
        let lockouts = self.lockouts.restore_markers().await?;
        let markers_ms = started.elapsed().as_millis() as u64;
        let subjects = self.scoring.restore().await? as u64;
        let factors_ms = started.elapsed().as_millis() as u64 - markers_ms;
        // Lockouts and factors are back: the new epoch ends every instance's fail-closed
        // period; the windows follow (an instance that dies meanwhile leaves them partial,
        // they fill again with new events).
        let id = self.clock.new_id().to_string();
        epoch::set(&self.hot, &self.keys, &id, self.clock.now_ms()).await?;
        self.limiter.set_rebuilding(false);
        let events = self.ingest.replay_windows(self.ipv6_prefix_len).await?;
        let windows_ms = started.elapsed().as_millis() as u64 - markers_ms - factors_ms;
        let now = self.clock.now_ms();
        let rebuilt = Rebuilt {
            at_ms: now,
            took_ms: started.elapsed().as_millis() as u64,
            enforced_ms: markers_ms + factors_ms,
            lockouts,
            subjects,
            events,
        };
        if lockouts + subjects + events > 0 {
            tracing::warn!(
                lockouts,
                subjects,
                events,
                took_ms = rebuilt.took_ms,
                markers_ms,
                factors_ms,
                windows_ms,
                epoch = %id,
                "the hot store had lost its data: rebuilt {lockouts} lockouts, {subjects} subjects' factors and {events} auth events' windows from the durable store"
            );
        } else {
            tracing::info!(epoch = %id, "the hot store's epoch marker is written (nothing to rebuild)");
        }
        Ok((rebuilt, id))
    }
}
