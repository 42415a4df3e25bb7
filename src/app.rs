//! The wiring diagram: [`App`] holds one field per service, built only by [`App::build`].

use std::ops::Deref;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::access::Access;
use crate::attestation::Attestation;
use crate::audit::Audit;
use crate::clock::{Clock, SystemClock};
use crate::config::Settings;
use crate::ingest::Ingest;
use crate::limiter::Limiter;
use crate::lockout::Lockouts;
use crate::reputation::Reputation;
use crate::reputation::lists::Lists;
use crate::reputation::signal::ReputationSignal;
use crate::scoring::Engine;
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
    /// Analysts' reads across domains (failing accounts, account timelines).
    pub analyst: crate::analyst::Analyst,
    /// Refused and challenged limit checks, kept for analysts.
    pub history: Arc<crate::analyst::history::History>,
    /// The traffic record for policy replay (`[record]`).
    pub recorder: Arc<crate::policy::record::Recorder>,
    /// Operators' runtime overrides of multipliers.
    pub overrides: crate::scoring::overrides::Overrides,
    /// A candidate policy run beside the live one, never enforced.
    pub canary: Arc<crate::policy::canary::Canary>,
    /// Rendered `/v1/multipliers` answers (the HTTP edge's cache).
    pub explanations: crate::scoring::Explanations,
    /// Layered token buckets (shared with the `tower` middleware, hence the `Arc`).
    pub limiter: Arc<Limiter>,
    /// Login velocity, challenges, lockouts.
    pub lockouts: Arc<Lockouts>,
    /// Auth-event batches.
    pub ingest: Ingest,
    /// OTP delivery events and each destination's conversion.
    pub messaging: crate::messaging::Messaging,
    /// IP/ASN reputation (range sources and ASN databases from the data dir).
    pub reputation: Arc<Reputation>,
    /// Manual allow/deny lists.
    pub lists: Arc<Lists>,
    /// Factors → multipliers, anomalies, repeat offenders, alerts, the decision stream.
    pub scoring: Arc<Engine>,
    /// Device attestation (challenges, verification, verdicts).
    pub attestation: Attestation,
    /// IP bans as CrowdSec's decisions stream.
    pub crowdsec: crate::integrations::crowdsec::Crowdsec,
    /// envoyproxy/ratelimit descriptor rules (`envoy.ratelimit_config`), when configured.
    pub envoy_rules: Option<Arc<crate::integrations::descriptors::watch::LiveRules>>,
    /// Notices a hot store that lost its data and rebuilds it from the durable store.
    pub recovery: crate::recovery::Recovery,
    /// What this region shares with the others (`[regions]`).
    pub regions: crate::regions::Regions,
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
    /// The App Attest root CA could not be read.
    #[error(transparent)]
    Attestation(#[from] crate::attestation::LoadError),
    /// An envoyproxy/ratelimit config file is not valid (named with the file).
    #[error("envoy.ratelimit_config: {0}")]
    EnvoyRules(#[from] crate::integrations::descriptors::ConfigError),
}

/// Runs `step` every `period` (the first at once) until `shutdown` fires.
fn every<F, Fut>(
    state: &AppState,
    shutdown: &tokio::sync::watch::Receiver<bool>,
    period: std::time::Duration,
    step: F,
) where
    F: Fn(AppState) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (app, mut stop) = (state.clone(), shutdown.clone());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.changed() => return,
            }
            step(app.clone()).await;
        }
    });
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
        let reputation = Arc::new(Reputation::open(
            &crate::reputation::locate(&settings.data_dir),
            settings.reputation.clone(),
            clock.clone(),
        )?);
        let access = Access::new(
            &stores,
            clock.clone(),
            settings.bootstrap_token.as_ref().map(|s| s.expose()),
            settings
                .bootstrap_token_expires_at
                .as_deref()
                .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                .map(|at| at.timestamp_millis()),
        );
        access.refresh_bootstrap().await.map_err(|err| match err {
            crate::access::Error::Store(store) => BuildError::Store(store),
            other => BuildError::Store(crate::store::Error::Unavailable {
                store: "durable",
                source: other.to_string().into(),
            }),
        })?;
        let audit = Audit::new(
            stores.durable.clone(),
            clock.clone(),
            crate::telemetry::privacy::Pseudonyms::new(&settings.privacy),
        );
        let analyst = crate::analyst::Analyst::new(stores.durable.clone(), clock.clone());
        let regions_postgres = match (settings.regions.enabled(), stores.durable.pool()) {
            (true, crate::store::Pool::Postgres(pool)) => Some(pool.clone()),
            _ => None,
        };
        let shares = regions_postgres
            .as_ref()
            .filter(|_| !settings.regions.global_budgets.is_empty())
            .map(|pool| {
                Arc::new(crate::regions::shares::Shares::new(
                    pool.clone(),
                    &settings.regions.name,
                    &clock.new_id().to_string(),
                    settings.regions.count,
                    settings.regions.renew_ms,
                    settings.regions.global_budgets.clone(),
                    clock.clone(),
                ))
            });
        let scoring = Arc::new(Engine::new(
            &settings,
            &stores,
            clock.clone(),
            reputation.clone(),
        ));
        let attestation = Attestation::new(&settings, &stores, clock.clone(), scoring.clone())?;
        let lockouts = Arc::new(Lockouts::new(
            &stores,
            clock.clone(),
            settings.lockout.clone(),
            scoring.clone(),
            audit.clone(),
            Arc::new(attestation.attested_devices()),
        ));
        let ingest = Ingest::new(
            stores.durable.clone(),
            clock.clone(),
            lockouts.clone(),
            scoring.clone(),
        );
        let messaging = crate::messaging::Messaging::new(
            stores.durable.clone(),
            scoring.clone(),
            settings.messaging.clone(),
        );
        // Each destination's conversion windows, from the deliveries of the last day.
        if let Err(err) = messaging.replay(clock.now_ms()).await {
            tracing::warn!(error.cause = %err, "could not count the stored deliveries into the conversions; they start empty");
        }
        let lists = Arc::new(Lists::new(
            &stores,
            clock.clone(),
            Arc::downgrade(&scoring),
            audit.clone(),
            settings.http.identifiers(),
            settings.limits.ipv6_prefix_len,
        ));
        // The signals scoring asks (pull); push signals (lockouts, attestation verdicts,
        // anomalies, offenders) hold the engine instead.
        scoring.register(vec![
            Arc::new(ReputationSignal::new(
                reputation.clone(),
                lists.clone(),
                settings.reputation.clone(),
                settings.scoring.public_classes.clone(),
            )),
            lists.clone(),
            Arc::new(attestation.unverified_signal()),
        ]);
        let attested: Arc<dyn crate::limiter::AttestedDevices> =
            Arc::new(attestation.attested_devices());
        let exemptions: Arc<dyn crate::limiter::Exemptions> =
            Arc::new(crate::lockout::LockoutRule::new(lockouts.clone()));
        let history = Arc::new(crate::analyst::history::History::new(
            stores.durable.clone(),
            clock.clone(),
            scoring.clone(),
            settings.history.clone(),
        ));
        let recorder = Arc::new(crate::policy::record::Recorder::new(
            stores.durable.clone(),
            clock.clone(),
            crate::telemetry::privacy::Pseudonyms::new(&settings.privacy),
            settings.record.clone(),
        ));
        // Built last of the rooms it asks, each handed in: nothing is installed later.
        let limiter = Limiter::new(
            &settings.limits,
            stores.hot.clone(),
            stores.keys.clone(),
            clock.clone(),
        )
        .with_sockets(crate::limiter::Sockets {
            defaults: Some(scoring.clone()),
            exemptions: Some(exemptions.clone()),
            attested: Some(attested.clone()),
            history: history
                .enabled()
                .then(|| history.clone() as Arc<dyn crate::limiter::DecisionSink>),
            recorder: recorder
                .enabled()
                .then(|| recorder.clone() as Arc<dyn crate::limiter::TrafficSink>),
        });
        let limiter = Arc::new(match &shares {
            Some(shares) => {
                limiter.with_shares(shares.clone() as Arc<dyn crate::limiter::GlobalShares>)
            }
            None => limiter,
        });
        let canary = Arc::new(crate::policy::canary::Canary::new(
            stores.durable.clone(),
            stores.hot.clone(),
            stores.keys.clone(),
            clock.clone(),
            audit.clone(),
            crate::policy::canary::Sockets {
                defaults: scoring.clone(),
                exemptions,
                attested,
                live: limiter.clone(),
                configured: settings.limits.clone(),
            },
        ));
        if let Err(err) = canary.refresh().await {
            tracing::warn!(error.cause = %err, "could not read the canary policy; will retry");
        }
        let overrides = crate::scoring::overrides::Overrides::new(
            stores.durable.clone(),
            clock.clone(),
            scoring.clone(),
            audit.clone(),
        );
        // A published multiplier clears the limiter's L1: the engine holds the cache, not
        // the limiter (which holds the engine).
        scoring.on_publish(limiter.l1_clearer());
        lists.refresh().await.map_err(|err| match err {
            crate::reputation::lists::Error::Store(store) => BuildError::Store(store),
            other => BuildError::Store(crate::store::Error::Unavailable {
                store: "durable",
                source: other.to_string().into(),
            }),
        })?;
        let crowdsec = crate::integrations::crowdsec::Crowdsec::new(
            stores.durable.clone(),
            lists.clone(),
            clock.clone(),
            settings.crowdsec.clone(),
        );
        let recovery = crate::recovery::Recovery::new(
            &stores,
            clock.clone(),
            lockouts.clone(),
            scoring.clone(),
            limiter.clone(),
            ingest.clone(),
            settings.limits.ipv6_prefix_len,
        );
        let regions = crate::regions::Regions {
            changes: regions_postgres.map(|pool| {
                Arc::new(crate::regions::changes::Changes::new(
                    pool,
                    &settings.regions.name,
                    lockouts.clone(),
                    scoring.clone(),
                    stores.hot.clone(),
                    stores.keys.clone(),
                    clock.clone(),
                ))
            }),
            shares,
        };
        // Before serving: a hot store without its epoch marker (in process: every start) is
        // rebuilt from the durable store. A failure is retried every second once serving.
        if let Err(err) = recovery.check().await {
            tracing::warn!(error.cause = %err, "could not check the hot store's epoch; will retry");
        }
        // The recorder first: the load is counted.
        crate::telemetry::metrics::handle();
        let envoy_rules = if settings.envoy.ratelimit_config.is_empty() {
            None
        } else {
            let rules = crate::integrations::descriptors::watch::LiveRules::load(
                settings.envoy.ratelimit_config.clone(),
                settings.envoy.merge_domains,
            )?;
            tracing::info!(
                domains = ?rules.current().domains().collect::<Vec<_>>(),
                "envoy ratelimit config loaded"
            );
            Some(Arc::new(rules))
        };
        Ok(App {
            recovery,
            regions,
            settings: {
                crate::telemetry::metrics::handle();
                crate::telemetry::metrics::zero();
                crate::limiter::Budgets::from_settings(&settings.limits).zero_metrics();
                Arc::new(settings)
            },
            stores,
            access,
            analyst,
            history,
            recorder,
            overrides,
            canary,
            audit,
            limiter,
            lockouts,
            ingest,
            messaging,
            reputation,
            lists,
            scoring,
            attestation,
            crowdsec,
            envoy_rules,
            clock,
            explanations: Default::default(),
            metrics: crate::telemetry::metrics::handle(),
        })
    }

    /// Starts the background tasks (list refresh, the hot store's epoch check, scoring's due
    /// republishing, offender flushes and webhook delivery every second, hourly retention
    /// pruning); they stop when
    /// `shutdown` fires. Each has a one-step function tests call instead
    /// (`Ingest::prune_once`, `Engine::republish_due`, `Engine::flush_offenders`,
    /// `Alerts::deliver_pending`).
    pub fn spawn_background(state: &AppState, shutdown: tokio::sync::watch::Receiver<bool>) {
        let second = std::time::Duration::from_secs(1);
        every(state, &shutdown, second, |app| async move {
            if let Err(err) = app.scoring.republish_due().await {
                tracing::warn!(error.cause = %err, "republishing due multipliers failed; will retry");
            }
            if let Err(err) = app.canary.refresh().await {
                tracing::warn!(error.cause = %err, "reading the canary policy failed; will retry");
            }
            if let Err(err) = app.scoring.shared_ips().refresh().await {
                tracing::warn!(error.cause = %err, "reading shared addresses failed; will retry");
            }
            if let Err(err) = app.scoring.network_suspects().refresh().await {
                tracing::warn!(error.cause = %err, "suspected networks could not be read back");
            }
            if let Err(err) = app.scoring.network_blocks().refresh().await {
                tracing::warn!(error.cause = %err, "reading blocked networks failed; will retry");
            }
            if let Err(err) = app.scoring.login_guard().flush().await {
                tracing::warn!(error.cause = %err, "sharing login counts failed; will retry");
            }
            if let Err(err) = app.scoring.flush_offenders().await {
                tracing::warn!(error.cause = %err, "flushing repeat-offender counts failed; will retry");
            }
            if let Err(err) = app.scoring.alerts().deliver_pending().await {
                tracing::warn!(error.cause = %err, "delivering alerts failed; will retry");
            }
            // An admin token made on another instance retires the bootstrap token here.
            if let Err(err) = app.access.refresh_bootstrap().await {
                tracing::debug!(error.cause = %err, "could not check for admin tokens; will retry");
            }
            let (tracked, _, _) = app.scoring.baseline_keys();
            metrics::gauge!(crate::telemetry::metrics::BASELINE_KEYS).set(tracked as f64);
        });
        if let Some(rules) = &state.envoy_rules {
            rules.spawn_watch(shutdown.clone());
        }
        state.regions.spawn(&shutdown);
        // A hot store that lost its data is noticed (and rebuilt) within a second or two.
        every(state, &shutdown, second, |app| async move {
            if let Err(err) = app.recovery.check().await {
                tracing::debug!(error.cause = %err, "checking the hot store's epoch failed; will retry");
            }
        });
        // The decision history: written each window, and once more on shutdown.
        if state.history.enabled() {
            let (app, mut stop) = (state.clone(), shutdown.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(app.history.window());
                every.tick().await;
                loop {
                    let stopping = tokio::select! {
                        _ = every.tick() => false,
                        _ = stop.changed() => true,
                    };
                    if let Err(err) = app.history.flush().await {
                        tracing::warn!(error.cause = %err, "writing the decision history failed; those entries are lost");
                    }
                    if stopping {
                        return;
                    }
                }
            });
        }
        // The traffic record: written each second, and once more on shutdown.
        if state.recorder.enabled() {
            let (app, mut stop) = (state.clone(), shutdown.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(second);
                every.tick().await;
                loop {
                    let stopping = tokio::select! {
                        _ = every.tick() => false,
                        _ = stop.changed() => true,
                    };
                    if let Err(err) = app.recorder.flush().await {
                        tracing::warn!(error.cause = %err, "writing the traffic record failed; those checks are lost");
                    }
                    if stopping {
                        return;
                    }
                }
            });
        }
        // Lists changed on another instance are picked up within half a second.
        every(state, &shutdown, second / 2, |app| async move {
            if let Err(err) = app.lists.refresh_if_changed().await {
                tracing::warn!(error.cause = %err, "refreshing allow/deny lists failed; will retry");
            }
        });
        every(state, &shutdown, second * 3600, |app| async move {
            let days = i64::try_from(app.settings.lockout.retention_days).unwrap_or(i64::MAX);
            let cutoff = app
                .clock
                .now_ms()
                .saturating_sub(days.saturating_mul(86_400_000));
            let hours =
                i64::try_from(app.settings.scoring.telemetry_retention_hours).unwrap_or(i64::MAX);
            let telemetry_cutoff = app
                .clock
                .now_ms()
                .saturating_sub(hours.saturating_mul(3_600_000));
            if let Err(err) = app.scoring.prune_factors().await {
                tracing::warn!(error.cause = %err, "pruning expired factors failed; will retry");
            }
            if let Err(err) = app.recorder.prune().await {
                tracing::warn!(error.cause = %err, "pruning the traffic record failed; will retry");
            }
            if let Err(err) = app.history.prune().await {
                tracing::warn!(error.cause = %err, "pruning the decision history failed; will retry");
            }
            if let Err(err) = app.messaging.prune(cutoff).await {
                tracing::warn!(error.cause = %err, "pruning delivery events failed; will retry");
            }
            if let Err(err) = app.ingest.prune_requests_once(telemetry_cutoff).await {
                tracing::warn!(error.cause = %err, "pruning request telemetry failed; will retry");
            }
            match app.ingest.prune_once(cutoff).await {
                Ok(deleted) => tracing::info!(
                    deleted,
                    "pruned {deleted} auth events older than {days} days"
                ),
                Err(err) => {
                    tracing::warn!(error.cause = %err, "pruning auth events failed; will retry")
                }
            }
        });
    }

    /// Wraps the app as router state.
    pub fn into_state(self) -> AppState {
        AppState(Arc::new(self))
    }
}
