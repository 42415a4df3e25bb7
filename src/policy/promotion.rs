//! Promotion: the live `[limits]` of every instance, the promoted policy's (kept in the
//! durable store, read each second and at start, so a restart keeps it) or the settings
//! file's after a revert. A promotion swaps the live limiter's budgets whole.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use serde::Serialize;

use crate::config::{LimitSettings, Settings};
use crate::limiter::Limiter;
use crate::store::{Durable, Error, with_pool};

/// The promoted policy in force.
#[derive(Debug, Clone)]
struct Promoted {
    id: String,
    promoted_at_ms: i64,
    promoted_by: String,
    limits: LimitSettings,
}

/// Where the live `[limits]` come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LiveStatus {
    /// `settings` (the settings file) or `promoted` (a promoted canary).
    pub source: &'static str,
    /// The promoted candidate's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When it was promoted, Unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promoted_at_ms: Option<i64>,
    /// Who promoted it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promoted_by: Option<String>,
}

/// The promoted policy in force: id, TOML, when and by whom; None when none is.
async fn promoted_row(durable: &Durable) -> Result<Option<(String, String, i64, String)>, Error> {
    Ok(with_pool!(durable, |pool| sqlx::query_as(
        "SELECT id, policy, promoted_at, promoted_by FROM policy_candidates \
         WHERE promoted_at IS NOT NULL AND reverted_at IS NULL \
         ORDER BY promoted_at DESC, id DESC LIMIT 1"
    )
    .fetch_optional(pool)
    .await)?)
}

/// Why the promoted policy could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PromotedError {
    /// Its TOML no longer loads (a newer build's setting).
    #[error("the promoted policy {id}: {reason}")]
    Invalid {
        /// The promoted candidate's id.
        id: String,
        /// Why it does not load.
        reason: String,
    },
    /// A store failed.
    #[error(transparent)]
    Store(#[from] Error),
}

/// The live `[limits]` as the store holds them, for tools that run beside the service: the
/// promoted policy's (with its id), else `configured` (the settings file's).
pub async fn stored_live_limits(
    durable: &Durable,
    configured: &LimitSettings,
) -> Result<(LimitSettings, Option<String>), PromotedError> {
    match promoted_row(durable).await? {
        Some((id, policy, _, _)) => {
            let settings =
                Settings::candidate_toml(&policy).map_err(|e| PromotedError::Invalid {
                    id: id.clone(),
                    reason: e.to_string(),
                })?;
            Ok((settings.limits, Some(id)))
        }
        None => Ok((configured.clone(), None)),
    }
}

/// The promoted policy of one instance.
#[derive(Debug)]
pub(super) struct Promotion {
    durable: Durable,
    /// The live limiter (a promotion swaps its budgets).
    live: Arc<Limiter>,
    /// The settings file's `[limits]` (in force when nothing is promoted).
    configured: LimitSettings,
    promoted: ArcSwapOption<Promoted>,
}

impl Promotion {
    /// Nothing promoted yet: the settings file's `configured` limits are live.
    pub(super) fn new(durable: Durable, live: Arc<Limiter>, configured: LimitSettings) -> Self {
        Self {
            durable,
            live,
            configured,
            promoted: ArcSwapOption::empty(),
        }
    }

    /// Where the live `[limits]` come from on this instance.
    pub fn status(&self) -> LiveStatus {
        match self.promoted.load_full() {
            Some(p) => LiveStatus {
                source: "promoted",
                id: Some(p.id.clone()),
                promoted_at_ms: Some(p.promoted_at_ms),
                promoted_by: Some(p.promoted_by.clone()),
            },
            None => LiveStatus {
                source: "settings",
                id: None,
                promoted_at_ms: None,
                promoted_by: None,
            },
        }
    }

    /// The live `[limits]`: the promoted policy's, else the settings file's.
    pub fn limits(&self) -> LimitSettings {
        self.promoted
            .load_full()
            .map_or_else(|| self.configured.clone(), |p| p.limits.clone())
    }

    /// The id of the promoted policy in force.
    pub fn id(&self) -> Option<String> {
        self.promoted.load().as_ref().map(|p| p.id.clone())
    }

    /// Puts the promoted policy in force if it changed (every second and at start).
    pub async fn refresh(&self) -> Result<(), Error> {
        let row = promoted_row(&self.durable).await?;
        let current = self.promoted.load_full();
        match (row, current) {
            (None, None) => {}
            (None, Some(_)) => {
                if let Err(err) = self.live.set_budgets(&self.configured) {
                    tracing::error!(error.cause = %err, "the settings file's limits do not load");
                }
                self.promoted.store(None);
                tracing::info!("promotion reverted: the settings file's limits are live");
            }
            (Some((id, _, _, _)), Some(current)) if current.id == id => {}
            (Some((id, policy, promoted_at_ms, promoted_by)), _) => {
                let limits = match Settings::candidate_toml(&policy) {
                    Ok(settings) => settings.limits,
                    Err(err) => {
                        tracing::error!(policy.id = %id, error.cause = %err, "the promoted policy does not load; the limits in force stay");
                        return Ok(());
                    }
                };
                match self.live.set_budgets(&limits) {
                    Ok(()) => {
                        tracing::info!(policy.id = %id, policy.promoted_by = %promoted_by, "promoted policy {id} is live");
                        self.promoted.store(Some(Arc::new(Promoted {
                            id,
                            promoted_at_ms,
                            promoted_by,
                            limits,
                        })));
                    }
                    Err(err) => {
                        tracing::error!(policy.id = %id, error.cause = %err, "the promoted policy does not fit; the limits in force stay");
                    }
                }
            }
        }
        Ok(())
    }
}
