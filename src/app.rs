//! The wiring diagram: [`App`] holds one field per service, built only by [`App::build`].

use std::ops::Deref;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::access::Access;
use crate::audit::Audit;
use crate::clock::{Clock, SystemClock};
use crate::config::Settings;
use crate::ingest::Ingest;
use crate::limiter::Limiter;
use crate::lockout::Lockouts;
use crate::reputation::Reputation;
use crate::reputation::lists::Lists;
use crate::store::Stores;

/// Everything a request handler or background task needs.
#[derive(Debug)]
pub struct App {
    /// The validated settings.
    pub settings: Arc<Settings>,
    /// Durable and hot stores.
    pub stores: Stores,
    /// API tokens and roles.
    pub access: Access,
    /// Audit log.
    pub audit: Audit,
    /// Layered token buckets (shared with the `tower` middleware, hence the `Arc`).
    pub limiter: Arc<Limiter>,
    /// Login velocity, challenges, lockouts.
    pub lockouts: Arc<Lockouts>,
    /// Auth-event batches.
    pub ingest: Ingest,
    /// IP/ASN reputation (range sources and ASN databases from the data dir).
    pub reputation: Reputation,
    /// Manual allow/deny lists.
    pub lists: Lists,
    /// Wall and monotonic time for every domain.
    pub clock: Arc<dyn Clock>,
    /// Prometheus exposition of this process's metrics.
    pub metrics: PrometheusHandle,
}

/// Why the app could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A store could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    /// A data file could not be loaded (named with its line).
    #[error("PALISADE_DATA_DIR: {0}")]
    Data(#[from] crate::reputation::LoadError),
}

/// Shared state of the HTTP application (cheap to clone).
#[derive(Debug, Clone)]
pub struct AppState(pub Arc<App>);

impl Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

impl App {
    /// Opens the stores (applying migrations) and builds every service with the real clock.
    pub async fn build(settings: Settings) -> Result<App, BuildError> {
        Self::build_with_clock(settings, Arc::new(SystemClock::new())).await
    }

    /// Like [`App::build`] with a given clock (tests and benches pass a `ManualClock`).
    pub async fn build_with_clock(
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<App, BuildError> {
        let stores = Stores::open(&settings).await?;
        let reputation = Reputation::open(&settings.data_dir, settings.reputation.clone())?;
        let access = Access::new(
            stores.durable.clone(),
            clock.clone(),
            settings.bootstrap_token.as_ref().map(|s| s.expose()),
        );
        let audit = Audit::new(stores.durable.clone(), clock.clone());
        let limiter = Arc::new(Limiter::new(
            &settings.limits,
            stores.hot.clone(),
            stores.keys.clone(),
            clock.clone(),
        ));
        let lockouts = Arc::new(Lockouts::new(
            &stores,
            clock.clone(),
            settings.lockout.clone(),
            limiter.clone(),
            audit.clone(),
            settings.limits.ipv6_prefix_len,
        ));
        let ingest = Ingest::new(stores.durable.clone(), clock.clone(), lockouts.clone());
        let lists = Lists::new(
            &stores,
            clock.clone(),
            limiter.clone(),
            audit.clone(),
            settings.http.max_key_length,
            settings.limits.ipv6_prefix_len,
        );
        lists.refresh().await.map_err(|err| match err {
            crate::reputation::lists::Error::Store(store) => BuildError::Store(store),
            other => BuildError::Store(crate::store::Error::Unavailable {
                store: "durable",
                source: other.to_string().into(),
            }),
        })?;
        Ok(App {
            settings: Arc::new(settings),
            stores,
            access,
            audit,
            limiter,
            lockouts,
            ingest,
            reputation,
            lists,
            clock,
            metrics: crate::telemetry::metrics::handle(),
        })
    }

    /// Starts the background tasks (list refresh, hourly retention pruning); they stop
    /// when `shutdown` fires. Each has a one-step function tests call instead
    /// (`Ingest::prune_once`).
    pub fn spawn_background(state: &AppState, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        // Lists changed on another instance are picked up within half a second.
        let app = state.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_millis(500));
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stop.changed() => return,
                }
                if let Err(err) = app.lists.refresh_if_changed().await {
                    tracing::warn!(error.cause = %err, "refreshing allow/deny lists failed; will retry");
                }
            }
        });
        let app = state.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = shutdown.changed() => return,
                }
                let days = i64::try_from(app.settings.lockout.retention_days).unwrap_or(i64::MAX);
                let cutoff = app
                    .clock
                    .now_ms()
                    .saturating_sub(days.saturating_mul(86_400_000));
                match app.ingest.prune_once(cutoff).await {
                    Ok(deleted) => tracing::info!(
                        deleted,
                        "pruned {deleted} auth events older than {days} days"
                    ),
                    Err(err) => {
                        tracing::warn!(error.cause = %err, "pruning auth events failed; will retry")
                    }
                }
            }
        });
    }

    /// Wraps the app as router state.
    pub fn into_state(self) -> AppState {
        AppState(Arc::new(self))
    }
}
