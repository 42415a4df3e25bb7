//! Canary: a candidate `[limits]` every instance runs beside the live one, never enforced.
//!
//! Each live decision is asked again of the candidate in a task of its own (the answer the
//! client gets never waits for it). The candidate's buckets live in the same hot store
//! under budget names prefixed `canary-`, so they count the whole fleet's traffic, and it
//! reads the same multipliers, lockouts and exemptions as the live policy: the only
//! difference is the policy. While a canary is loaded each check costs a second bucket
//! evaluation. Differences are counted per class and deciding scope in this instance (the
//! report) and in `palisade_canary_decisions_total` (the fleet).
//!
//! **Promotion**: one call makes the canary the live `[limits]` of every instance (its
//! classes' patterns and budgets; the class names must stay those in force). It is kept in
//! the durable store, read each second and at start, so a restart keeps it; a revert goes
//! back to the settings file's `[limits]`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use serde::Serialize;

use crate::audit::{Actor, Audit};
use crate::clock::Clock;
use crate::config::{LimitSettings, Settings};
use crate::limiter::{Decision, DefaultMultipliers, Exemptions, LimitRequest, Limiter};
use crate::store::with_pool;
use crate::store::{Durable, Error, Hot, Keys};
use crate::telemetry::metrics as names;

use super::promotion::Promotion;
pub use super::promotion::{LiveStatus, stored_live_limits};

/// Prefix of the candidate's budget names (and so of its buckets' keys).
pub const BUDGET_PREFIX: &str = "canary-";

/// Counts of one class (or class and scope).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Checks compared.
    pub checks: u64,
    /// Both answered alike.
    pub same: u64,
    /// The live policy allowed, the candidate would refuse.
    pub would_refuse: u64,
    /// The live policy refused, the candidate would allow.
    pub would_allow: u64,
}

/// What this instance has seen of the canary in force.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The candidate's id.
    pub id: String,
    /// Why it was loaded.
    pub reason: String,
    /// Who loaded it.
    pub created_by: String,
    /// When, Unix ms.
    pub created_at_ms: i64,
    /// Per class.
    pub classes: BTreeMap<String, Counts>,
    /// Per class and deciding scope of the side that refused (`class/scope`), changes only.
    pub scopes: BTreeMap<String, Counts>,
}

/// A canary that ended, as `GET /v1/policy/candidates/last` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Ended {
    /// The candidate's id.
    pub id: String,
    /// Why it was loaded.
    pub reason: String,
    /// Who loaded it.
    pub created_by: String,
    /// When, Unix ms.
    pub created_at_ms: i64,
    /// When it ended, Unix ms.
    pub ended_at_ms: i64,
    /// Who ended it.
    pub ended_by: String,
    /// Promoted (true) or discarded.
    pub promoted: bool,
    /// Its report as the instance that ended it had counted it (absent when that instance
    /// had not loaded it yet).
    #[schema(value_type = Option<Object>)]
    pub report: Option<serde_json::Value>,
}

struct Loaded {
    id: String,
    reason: String,
    created_by: String,
    created_at_ms: i64,
    limiter: Limiter,
    counts: Mutex<(BTreeMap<String, Counts>, BTreeMap<String, Counts>)>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("id", &self.id).finish()
    }
}

/// Why a candidate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CanaryError {
    /// The TOML is not a valid settings file.
    #[error("policy: {0}")]
    Invalid(String),
    /// The candidate cannot be promoted (its classes differ from those in force).
    #[error("policy: {0}")]
    Conflict(String),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] Error),
}

/// What the live limiter is plugged into, for the candidate to see the same.
#[derive(Debug, Clone)]
pub struct Sockets {
    /// Default multipliers (scoring).
    pub defaults: Arc<dyn DefaultMultipliers>,
    /// The lockout-DoS rule.
    pub exemptions: Arc<dyn Exemptions>,
    /// Attested devices.
    pub attested: Arc<dyn crate::limiter::AttestedDevices>,
    /// The live limiter (a promotion swaps its budgets).
    pub live: Arc<Limiter>,
    /// The settings file's `[limits]` (in force when nothing is promoted).
    pub configured: LimitSettings,
}

/// The canary of one instance.
#[derive(Debug)]
pub struct Canary {
    durable: Durable,
    hot: Hot,
    keys: Keys,
    clock: Arc<dyn Clock>,
    audit: Audit,
    sockets: Sockets,
    current: ArcSwapOption<Loaded>,
    /// The promoted policy in force.
    promotion: Promotion,
    /// Canary checks on their way at once; beyond it a check is not compared (counted as
    /// `skipped`), so a slow hot store cannot pile up tasks.
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// Canary checks on their way at once per instance.
const MAX_IN_FLIGHT: usize = 1024;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The candidate's `[limits]` with its budgets renamed into the canary's namespace.
fn renamed(limits: &LimitSettings) -> LimitSettings {
    let mut limits = limits.clone();
    for budget in &mut limits.budgets {
        budget.name = format!("{BUDGET_PREFIX}{}", budget.name);
    }
    limits
}

type Row = (String, String, String, i64, String);

impl Canary {
    /// No canary yet; `sockets` are the live limiter's.
    pub fn new(
        durable: Durable,
        hot: Hot,
        keys: Keys,
        clock: Arc<dyn Clock>,
        audit: Audit,
        sockets: Sockets,
    ) -> Self {
        let promotion = Promotion::new(
            durable.clone(),
            sockets.live.clone(),
            sockets.configured.clone(),
        );
        Self {
            durable,
            hot,
            keys,
            clock,
            audit,
            sockets,
            current: ArcSwapOption::empty(),
            promotion,
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        }
    }

    /// Stores a candidate as the canary in force (every instance loads it within a second);
    /// audited as `policy.canary_load`. Returns its id.
    pub async fn load(
        &self,
        policy: &str,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<String, CanaryError> {
        let settings =
            Settings::candidate_toml(policy).map_err(|e| CanaryError::Invalid(e.to_string()))?;
        // Refused now rather than at promotion: a canary that could never be promoted.
        self.sockets
            .live
            .same_classes(&settings.limits)
            .map_err(CanaryError::Conflict)?;
        let id = self.clock.new_id().to_string();
        let now = self.clock.now_ms();
        with_pool!(&self.durable, |pool| sqlx::query(
            "INSERT INTO policy_candidates (id, policy, reason, created_at, created_by) \
             VALUES ($1, $2, $3, $4, $5)"
        )
        .bind(&id)
        .bind(policy)
        .bind(reason)
        .bind(now)
        .bind(&actor.name)
        .execute(pool)
        .await
        .map(|_| ()))
        .map_err(Error::from)?;
        self.audit
            .record(
                actor,
                "policy.canary_load",
                &id,
                serde_json::json!({ "reason": reason, "bytes": policy.len() }),
                request_id,
            )
            .await?;
        self.refresh().await?;
        Ok(id)
    }

    /// Discards the canary in force (every instance drops it within a second); audited as
    /// `policy.canary_discard`. False when none is in force.
    pub async fn discard(
        &self,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<bool, Error> {
        self.end(
            [
                "SELECT id FROM policy_candidates WHERE discarded_at IS NULL",
                "UPDATE policy_candidates SET discarded_at = $1, discarded_by = $2, \
                     report = $3 WHERE discarded_at IS NULL",
            ],
            "policy.canary_discard",
            (reason, actor, request_id),
        )
        .await
    }

    /// Ends the rows `select` finds with `update` (binding now and the actor), audits each
    /// under `action`, and refreshes; false when no row matched.
    async fn end(
        &self,
        [select, update]: [&'static str; 2],
        action: &str,
        (reason, actor, request_id): (&str, &Actor, &str),
    ) -> Result<bool, Error> {
        let ids: Vec<String> = with_pool!(&self.durable, |pool| sqlx::query_scalar(select)
            .fetch_all(pool)
            .await)?;
        if ids.is_empty() {
            return Ok(false);
        }
        let now = self.clock.now_ms();
        // The canary's report as this instance counted it (a revert has none to keep).
        let report = self.report().filter(|r| ids.contains(&r.id));
        let report_text = report.as_ref().and_then(|r| serde_json::to_string(r).ok());
        with_pool!(&self.durable, |pool| {
            let mut query = sqlx::query(update).bind(now).bind(&actor.name);
            if update.contains("$3") {
                query = query.bind(report_text.as_deref());
            }
            query.execute(pool).await.map(|_| ())
        })?;
        for id in &ids {
            let mut details = serde_json::json!({ "reason": reason });
            if let Some(report) = report.as_ref().filter(|r| &r.id == id) {
                details["report"] = serde_json::to_value(report).unwrap_or_default();
            }
            self.audit
                .record(actor, action, id, details, request_id)
                .await?;
        }
        self.refresh().await?;
        Ok(true)
    }

    /// Makes the canary in force the live policy of every instance (within a second; kept
    /// across restarts) and ends it as a canary; audited as `policy.promote`. None when no
    /// canary is in force; Conflict when its class names differ from those in force.
    pub async fn promote(
        &self,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Option<String>, CanaryError> {
        let row: Option<(String, String)> = with_pool!(&self.durable, |pool| sqlx::query_as(
            "SELECT id, policy FROM policy_candidates WHERE discarded_at IS NULL \
             ORDER BY id DESC LIMIT 1"
        )
        .fetch_optional(pool)
        .await)
        .map_err(Error::from)?;
        let Some((id, policy)) = row else {
            return Ok(None);
        };
        let settings =
            Settings::candidate_toml(&policy).map_err(|e| CanaryError::Invalid(e.to_string()))?;
        self.sockets
            .live
            .same_classes(&settings.limits)
            .map_err(CanaryError::Conflict)?;
        let now = self.clock.now_ms();
        let report = self.report().filter(|r| r.id == id);
        let report_text = report.as_ref().and_then(|r| serde_json::to_string(r).ok());
        with_pool!(&self.durable, |pool| sqlx::query(
            "UPDATE policy_candidates SET promoted_at = $1, promoted_by = $2, \
             discarded_at = $1, discarded_by = $2, report = $4 WHERE id = $3"
        )
        .bind(now)
        .bind(&actor.name)
        .bind(&id)
        .bind(&report_text)
        .execute(pool)
        .await
        .map(|_| ()))
        .map_err(Error::from)?;
        let mut details = serde_json::json!({ "reason": reason });
        if let Some(report) = &report {
            details["report"] = serde_json::to_value(report).unwrap_or_default();
        }
        self.audit
            .record(actor, "policy.promote", &id, details, request_id)
            .await?;
        self.refresh().await?;
        Ok(Some(id))
    }

    /// Goes back to the settings file's `[limits]` on every instance within a second;
    /// audited as `policy.revert`. False when nothing is promoted.
    pub async fn revert(
        &self,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<bool, Error> {
        self.end(
            [
                "SELECT id FROM policy_candidates \
                 WHERE promoted_at IS NOT NULL AND reverted_at IS NULL",
                "UPDATE policy_candidates SET reverted_at = $1, reverted_by = $2 \
                 WHERE promoted_at IS NOT NULL AND reverted_at IS NULL",
            ],
            "policy.revert",
            (reason, actor, request_id),
        )
        .await
    }

    /// Where the live `[limits]` come from on this instance.
    pub fn live(&self) -> LiveStatus {
        self.promotion.status()
    }

    /// The live `[limits]`: the promoted policy's, else the settings file's.
    pub fn live_limits(&self) -> LimitSettings {
        self.promotion.limits()
    }

    /// The ids of the promoted policy in force and of the canary (None: none), in one small
    /// query: every instance asks every second, and reads a policy only when its id changed.
    async fn ids_in_force(&self) -> Result<(Option<String>, Option<String>), Error> {
        Ok(with_pool!(&self.durable, |pool| sqlx::query_as(
            "SELECT \
             (SELECT id FROM policy_candidates \
              WHERE promoted_at IS NOT NULL AND reverted_at IS NULL \
              ORDER BY promoted_at DESC, id DESC LIMIT 1), \
             (SELECT id FROM policy_candidates WHERE discarded_at IS NULL \
              ORDER BY id DESC LIMIT 1)"
        )
        .fetch_one(pool)
        .await)?)
    }

    /// Loads the canary (and the promoted policy) in force if they changed (every second
    /// on every instance).
    pub async fn refresh(&self) -> Result<(), Error> {
        let (promoted, canary) = self.ids_in_force().await?;
        if promoted != self.promotion.id() {
            self.promotion.refresh().await?;
        }
        if canary != self.current.load().as_ref().map(|c| c.id.clone()) {
            self.refresh_canary().await?;
        }
        Ok(())
    }

    /// Loads the newest canary (or none).
    async fn refresh_canary(&self) -> Result<(), Error> {
        let row: Option<Row> = with_pool!(&self.durable, |pool| sqlx::query_as(
            "SELECT id, policy, reason, created_at, created_by FROM policy_candidates \
             WHERE discarded_at IS NULL ORDER BY id DESC LIMIT 1"
        )
        .fetch_optional(pool)
        .await)?;
        let current = self.current.load();
        match (row, current.as_ref()) {
            (None, None) => {}
            (None, Some(_)) => self.current.store(None),
            (Some((id, _, _, _, _)), Some(loaded)) if loaded.id == id => {}
            (Some((id, policy, reason, created_at_ms, created_by)), _) => {
                // Stored only after it validated; a row that no longer parses (a newer
                // build's setting) is not run.
                match Settings::candidate_toml(&policy) {
                    Ok(settings) => {
                        let limiter = Limiter::new(
                            &renamed(&settings.limits),
                            self.hot.clone(),
                            self.keys.clone(),
                            self.clock.clone(),
                        )
                        .unobserved()
                        .with_sockets(crate::limiter::Sockets {
                            defaults: Some(self.sockets.defaults.clone()),
                            exemptions: Some(self.sockets.exemptions.clone()),
                            attested: Some(self.sockets.attested.clone()),
                            ..crate::limiter::Sockets::default()
                        });
                        self.current.store(Some(Arc::new(Loaded {
                            id,
                            reason,
                            created_by,
                            created_at_ms,
                            limiter,
                            counts: Mutex::new(Default::default()),
                        })));
                    }
                    Err(err) => {
                        tracing::warn!(canary.id = %id, error.cause = %err, "the canary policy does not load; not running it");
                        self.current.store(None);
                    }
                }
            }
        }
        Ok(())
    }

    /// Asks the canary about a request the live policy decided, in a task of its own.
    pub fn observe(self: &Arc<Self>, request: &LimitRequest, live: &Decision) {
        let Some(loaded) = self.current.load_full() else {
            return;
        };
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            metrics::counter!(names::CANARY_DECISIONS_TOTAL, "class" => live.class.to_string(), "scope" => "none", "outcome" => "skipped")
                .increment(1);
            return;
        };
        let (request, live_allowed) = (request.clone(), live.allowed);
        let live_class = live.class.clone();
        let live_scope = live.deciding_scope().map_or("none", |s| s.scope.as_str());
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(candidate) = loaded.limiter.check(&request).await else {
                return;
            };
            let would = candidate.allowed;
            let outcome = match (live_allowed, would) {
                (true, false) => "would_refuse",
                (false, true) => "would_allow",
                _ => "same",
            };
            let scope = if !would {
                candidate
                    .deciding_scope()
                    .map_or("none", |s| s.scope.as_str())
            } else {
                live_scope
            };
            metrics::counter!(names::CANARY_DECISIONS_TOTAL, "class" => live_class.to_string(), "scope" => scope, "outcome" => outcome)
                .increment(1);
            let mut counts = lock(&loaded.counts);
            let class = counts.0.entry(live_class.to_string()).or_default();
            add(class, outcome);
            if outcome != "same" {
                add(
                    counts.1.entry(format!("{live_class}/{scope}")).or_default(),
                    outcome,
                );
            }
        });
    }

    /// The last canary that ended (promoted or discarded), with the report the instance that
    /// ended it had counted; None when none has ended.
    pub async fn last(&self) -> Result<Option<Ended>, Error> {
        type EndedRow = (
            String,
            String,
            String,
            i64,
            i64,
            String,
            Option<i64>,
            Option<String>,
        );
        let row: Option<EndedRow> = with_pool!(&self.durable, |pool| sqlx::query_as(
            "SELECT id, reason, created_by, created_at, discarded_at, discarded_by, \
             promoted_at, report FROM policy_candidates WHERE discarded_at IS NOT NULL \
             ORDER BY discarded_at DESC, id DESC LIMIT 1"
        )
        .fetch_optional(pool)
        .await)?;
        Ok(row.map(
            |(id, reason, created_by, created_at_ms, ended_at_ms, ended_by, promoted, report)| {
                Ended {
                    id,
                    reason,
                    created_by,
                    created_at_ms,
                    ended_at_ms,
                    ended_by,
                    promoted: promoted.is_some(),
                    report: report.and_then(|text| serde_json::from_str(&text).ok()),
                }
            },
        ))
    }

    /// What this instance has seen of the canary in force; None when there is none.
    pub fn report(&self) -> Option<Report> {
        let loaded = self.current.load_full()?;
        let counts = lock(&loaded.counts).clone();
        Some(Report {
            id: loaded.id.clone(),
            reason: loaded.reason.clone(),
            created_by: loaded.created_by.clone(),
            created_at_ms: loaded.created_at_ms,
            classes: counts.0,
            scopes: counts.1,
        })
    }
}

fn add(counts: &mut Counts, outcome: &str) {
    counts.checks += 1;
    match outcome {
        "would_refuse" => counts.would_refuse += 1,
        "would_allow" => counts.would_allow += 1,
        _ => counts.same += 1,
    }
}
