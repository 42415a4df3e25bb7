//! The loaded rules, swapped whole when their files change.
//!
//! The files' names, sizes and modification times are compared once a second (a poll, not
//! inotify: it also sees a ConfigMap's symlink swap and files on network mounts). A change
//! is loaded in full and swapped in only when every file is valid; a bad edit leaves the
//! rules in force, is logged with the file and the reason, and counted
//! (`palisade_envoy_config_loads_total{outcome="failed"}`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

use super::{ConfigError, Rules, load};
use crate::telemetry::metrics as names;

/// How often the files are compared.
pub const POLL: Duration = Duration::from_secs(1);

type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// The rules in force and where they come from.
#[derive(Debug)]
pub struct LiveRules {
    rules: ArcSwap<Rules>,
    paths: Vec<PathBuf>,
    merge_domains: bool,
    seen: Mutex<Fingerprint>,
}

fn fingerprint(paths: &[PathBuf]) -> Fingerprint {
    let files = load::files_under(paths).unwrap_or_default();
    let mut out: Fingerprint = files
        .into_iter()
        .map(|path| {
            let meta = std::fs::metadata(&path).ok();
            let len = meta.as_ref().map_or(0, std::fs::Metadata::len);
            let modified = meta.and_then(|m| m.modified().ok());
            (path, len, modified)
        })
        .collect();
    out.sort();
    out
}

impl LiveRules {
    /// Loads the files under `paths` (a file, or a folder's `*.yaml`/`*.yml`).
    pub fn load(paths: Vec<PathBuf>, merge_domains: bool) -> Result<Self, ConfigError> {
        let seen = fingerprint(&paths);
        let rules = load::load_paths(&paths, merge_domains)?;
        metrics::counter!(names::ENVOY_CONFIG_LOADS_TOTAL, "outcome" => "loaded").increment(1);
        Ok(Self {
            rules: ArcSwap::from_pointee(rules),
            paths,
            merge_domains,
            seen: Mutex::new(seen),
        })
    }

    /// The rules in force.
    pub fn current(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    /// Reloads when a file changed: Ok(true) when new rules are in force, Ok(false) when
    /// nothing changed; Err when the changed files are not valid (the rules stay).
    pub fn reload_if_changed(&self) -> Result<bool, ConfigError> {
        let now = fingerprint(&self.paths);
        {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *seen == now {
                return Ok(false);
            }
            *seen = now;
        }
        match load::load_paths(&self.paths, self.merge_domains) {
            Ok(rules) => {
                self.rules.store(Arc::new(rules));
                metrics::counter!(names::ENVOY_CONFIG_LOADS_TOTAL, "outcome" => "loaded")
                    .increment(1);
                Ok(true)
            }
            Err(err) => {
                metrics::counter!(names::ENVOY_CONFIG_LOADS_TOTAL, "outcome" => "failed")
                    .increment(1);
                Err(err)
            }
        }
    }

    /// Polls the files every [`POLL`] until `stop` is dropped or sent.
    pub fn spawn_watch(self: &Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let live = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
                }
                let checked = Arc::clone(&live);
                let outcome =
                    tokio::task::spawn_blocking(move || checked.reload_if_changed()).await;
                match outcome {
                    Ok(Ok(true)) => tracing::info!(
                        domains = ?live.current().domains().collect::<Vec<_>>(),
                        "envoy ratelimit config reloaded"
                    ),
                    Ok(Ok(false)) => {}
                    Ok(Err(err)) => tracing::error!(
                        error.cause = %err,
                        "envoy ratelimit config not reloaded; the rules in force stay"
                    ),
                    Err(err) => {
                        tracing::error!(error.cause = %err, "envoy ratelimit config check failed")
                    }
                }
            }
        });
    }
}
