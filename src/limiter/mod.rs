//! Layered token buckets: which budgets apply to a request, and checking them all at once.
//!
//! Owns the bucket reference model ([`bucket`], pure; read it first), classes and budgets
//! ([`budgets`]), the canonical request target ([`target`]), the in-process and Redis
//! backends and the L1 cache of blocked buckets. Reads multipliers published by scoring from
//! the hot store; never imports `scoring`. Does not know HTTP: `api::layer` is its `tower`
//! middleware and header rendering.

pub mod bucket;
pub mod budgets;
mod l1;

mod redis_backend;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::{FailMode, LimitSettings, ScopeKind};
use crate::model::{ClientIp, SubjectKey};
use crate::store::{Hot, Keys, MemoryHot};
use crate::telemetry::metrics as names;

pub use budgets::Budgets;

/// `retry_after_ms` reported for a bucket blocked by a multiplier that has no expiry
/// (e.g. a manual deny): ask again in a minute.
pub const BLOCKED_RETRY_MS: u64 = 60_000;

/// Multipliers of a request's subjects when nothing is published for them, for its class.
///
/// Scoring publishes a multiplier only for subjects with stored factors (a lockout, an
/// attestation, an anomaly); everything else about a subject (its IP's reputation, an
/// unattested device) is known locally and passed with each check, so the first request
/// from a datacenter IP is already judged by it, without a Redis write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// For the request's IP.
    pub ip: f64,
    /// For its user (or account).
    pub user: f64,
    /// For its device.
    pub device: f64,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            ip: 1.0,
            user: 1.0,
            device: 1.0,
        }
    }
}

/// The socket scoring plugs into: default multipliers of a request's subjects (the limiter
/// never imports scoring; `app` wires it).
pub trait DefaultMultipliers: Send + Sync + std::fmt::Debug {
    /// The defaults for `request` in endpoint class `class`.
    fn defaults(&self, class: &str, request: &LimitRequest) -> Defaults;
}

/// A locked account's request from a context the account knows (the lockout-DoS rule): it
/// is checked without the lockout and answered with a challenge for the gateway to ask.
#[derive(Debug, Clone, PartialEq)]
pub struct Challenge {
    /// The user's multiplier on the class without the lockout.
    pub multiplier: f64,
    /// Why (`known_context`).
    pub reason: crate::model::Reason,
    /// The lockout the context is exempt from.
    pub lockout_id: String,
}

/// The socket the lockout-DoS rule plugs into (the limiter never imports lockout; `app`
/// wires it): asked only for a request whose user's multiplier blocks it.
pub trait Exemptions: Send + Sync + std::fmt::Debug {
    /// A challenge instead of the block when a lockout is what blocks the request's user and
    /// the account knows the request's context; None when the block stands.
    fn exemption<'a>(
        &'a self,
        class: &'a str,
        request: &'a LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<Option<Challenge>, crate::store::Error>>;
}

/// One limit check, already parsed and normalised.
#[derive(Debug, Clone)]
pub struct LimitRequest {
    /// HTTP method of the protected request (upper case).
    pub method: String,
    /// Path of the protected request (query ignored for classification).
    pub endpoint: String,
    /// The client.
    pub ip: ClientIp,
    /// `user:…` if the request is authenticated (or the account, on auth endpoints).
    pub user: Option<SubjectKey>,
    /// `device:…` if known.
    pub device: Option<SubjectKey>,
    /// Tokens this request costs (≥ 1).
    pub cost: u32,
    /// False: answer without taking tokens.
    pub consume: bool,
}

/// The verdict of one scope (one budget's bucket for one subject).
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeOutcome {
    /// Budget name.
    pub budget: Arc<str>,
    /// Scope kind.
    pub scope: ScopeKind,
    /// Subject key text (`ip:…`).
    pub subject: Arc<str>,
    /// False for shadow budgets/classes: reported, never blocking.
    pub enforced: bool,
    /// The bucket held `cost` tokens.
    pub allowed: bool,
    /// Effective capacity (budget capacity × multiplier, floored).
    pub limit: u64,
    /// Whole tokens left.
    pub remaining: u64,
    /// Milliseconds until the bucket is full.
    pub reset_ms: u64,
    /// Milliseconds until the bucket holds `cost` tokens (0 if allowed).
    pub retry_after_ms: u64,
    /// The subject's multiplier for this class.
    pub multiplier: f64,
    /// The budget's configured limit (before the multiplier) and period, for policy headers.
    pub policy: (u32, u32),
}

/// The answer to one check.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Every enforced scope allowed (or the store was down and the class fails open).
    pub allowed: bool,
    /// The endpoint class.
    pub class: Arc<str>,
    /// Every applicable scope, in budget order.
    pub scopes: Vec<ScopeOutcome>,
    /// Index of the deciding scope: the blocking one with the longest wait, or when
    /// allowed the one with the fewest tokens left. None when no budget applies.
    pub deciding: Option<usize>,
    /// When a denied request may be retried, ms (0 when allowed).
    pub retry_after_ms: u64,
    /// Made without the hot store (fail-open).
    pub degraded: bool,
    /// Shadow scopes that would have blocked.
    pub shadow_blocked: Vec<usize>,
    /// Answered from the L1 cache of blocked buckets.
    pub cached: bool,
    /// The account is locked but knows this context: allowed as if not locked, and the
    /// gateway should ask for a step-up (the lockout-DoS rule).
    pub challenge: Option<Challenge>,
    /// Wall time of the decision, Unix ms (for `reset` in seconds).
    pub now_ms: i64,
}

impl Decision {
    /// The deciding scope, if any budget applied.
    pub fn deciding_scope(&self) -> Option<&ScopeOutcome> {
        self.deciding.map(|i| &self.scopes[i])
    }
}

/// Why a check could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `cost` exceeds what a budget can ever hold.
    #[error("cost {cost} exceeds the capacity {capacity} of budget {budget}")]
    CostAboveCapacity {
        /// The request's cost.
        cost: u32,
        /// The budget's capacity.
        capacity: u32,
        /// The budget.
        budget: String,
    },
    /// The hot store failed and the class fails closed.
    #[error("the hot store is unavailable and class {class} fails closed")]
    FailClosed {
        /// The class.
        class: String,
        /// The store failure.
        #[source]
        source: crate::store::Error,
    },
}

/// One scope of a request, resolved to keys and numbers.
#[derive(Debug, Clone)]
struct Scope {
    budget: usize,
    subject: SubjectKey,
    bucket_key: String,
    multiplier_key: String,
    params: bucket::Params,
    enforced: bool,
    /// Multiplier used when none is published for the subject.
    default_multiplier: f64,
    /// Multiplier used whatever is published (a known context of a locked account).
    multiplier_override: Option<f64>,
}

/// The limiter service.
#[derive(Debug)]
pub struct Limiter {
    budgets: Budgets,
    keys: Keys,
    hot: Hot,
    clock: Arc<dyn Clock>,
    l1: l1::L1,
    coalescer: redis_backend::Coalescer,
    defaults: std::sync::OnceLock<Arc<dyn DefaultMultipliers>>,
    exemptions: std::sync::OnceLock<Arc<dyn Exemptions>>,
}

impl Limiter {
    /// A limiter over the hot store with the effective `[limits]` settings.
    pub fn new(settings: &LimitSettings, hot: Hot, keys: Keys, clock: Arc<dyn Clock>) -> Self {
        Self {
            budgets: Budgets::from_settings(settings),
            keys,
            hot,
            clock,
            l1: l1::L1::new(Duration::from_millis(settings.l1_ttl_ms)),
            coalescer: redis_backend::Coalescer::new(
                settings.coalesce,
                settings.coalesce_in_flight.into(),
            ),
            defaults: std::sync::OnceLock::new(),
            exemptions: std::sync::OnceLock::new(),
        }
    }

    /// Installs the lockout-DoS rule (once; later calls are ignored).
    pub fn set_exemptions(&self, exemptions: Arc<dyn Exemptions>) {
        let _ = self.exemptions.set(exemptions);
    }

    /// Installs the source of default multipliers (once; later calls are ignored).
    pub fn set_defaults(&self, defaults: Arc<dyn DefaultMultipliers>) {
        let _ = self.defaults.set(defaults);
    }

    /// Forgets every cached blocked bucket of this instance (a multiplier changed).
    pub fn clear_l1(&self) {
        self.l1.clear();
    }

    /// The classes and budgets in force.
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    fn scopes(&self, class: usize, request: &LimitRequest) -> Vec<Scope> {
        let class_info = &self.budgets.classes[class];
        let defaults = self
            .defaults
            .get()
            .map_or_else(Defaults::default, |d| d.defaults(&class_info.name, request));
        self.budgets
            .applicable(class, request.user.is_some(), request.device.is_some())
            .filter_map(|index| {
                let budget = &self.budgets.budgets[index];
                let (subject, default_multiplier) = match budget.scope {
                    ScopeKind::Global => (SubjectKey::global(), 1.0),
                    ScopeKind::Ip | ScopeKind::EndpointIp => {
                        (SubjectKey::ip(&request.ip), defaults.ip)
                    }
                    ScopeKind::User | ScopeKind::EndpointUser => {
                        (request.user.clone()?, defaults.user)
                    }
                    ScopeKind::Device => (request.device.clone()?, defaults.device),
                };
                Some(Scope {
                    budget: index,
                    bucket_key: self.keys.bucket(&subject, &budget.name),
                    multiplier_key: self.keys.multiplier(&subject, &class_info.name),
                    subject,
                    params: bucket::Params {
                        capacity: f64::from(budget.capacity()),
                        refill_per_s: budget.refill_per_s(),
                        multiplier: 1.0,
                    },
                    enforced: !(budget.shadow || class_info.shadow),
                    default_multiplier: sanitized(default_multiplier),
                    multiplier_override: None,
                })
            })
            .collect()
    }

    /// Consumes `cost` tokens from every scope of the request, or from none.
    ///
    /// The strictest scope decides and is the one reported. `retry_after_ms` is when that
    /// bucket will hold `cost` tokens again, not an estimate. When the hot store fails, the
    /// class's failure policy answers: fail-open allows (`degraded`), fail-closed errors.
    pub async fn check(&self, request: &LimitRequest) -> Result<Decision, Error> {
        let class = self.budgets.classify(&request.method, &request.endpoint);
        let class_name = self.budgets.classes[class].name.clone();
        let scopes = self.scopes(class, request);
        for scope in scopes.iter().filter(|s| s.enforced) {
            let budget = &self.budgets.budgets[scope.budget];
            if request.cost > budget.capacity() {
                return Err(Error::CostAboveCapacity {
                    cost: request.cost,
                    capacity: budget.capacity(),
                    budget: budget.name.clone(),
                });
            }
        }
        let now_ms = self.clock.now_ms();
        let now_us = self.clock.monotonic_us();

        if matches!(self.hot, Hot::Redis(_))
            && request.consume
            && let Some(outcomes) = self.l1_hit(&scopes, request.cost, now_us)
        {
            metrics::counter!(names::LIMIT_L1_HITS_TOTAL).increment(1);
            return Ok(self.conclude(class_name, outcomes, now_ms, false, true));
        }

        let mut scopes = scopes;
        let mut outcomes = match self.evaluate(&scopes, request, now_us).await {
            Ok(outcomes) => outcomes,
            Err(source) => return self.degraded(class, class_name, &scopes, now_ms, source),
        };
        let mut challenge = None;
        if let Some(exemptions) = self.exemptions.get()
            && blocked_only_by_user_multiplier(&scopes, &outcomes)
        {
            match exemptions.exemption(&class_name, request).await {
                Ok(Some(exempt)) => {
                    for scope in scopes.iter_mut().filter(|s| is_user_scope(s)) {
                        scope.multiplier_override = Some(sanitized(exempt.multiplier));
                    }
                    outcomes = match self.evaluate(&scopes, request, now_us).await {
                        Ok(outcomes) => outcomes,
                        Err(source) => {
                            return self.degraded(class, class_name, &scopes, now_ms, source);
                        }
                    };
                    challenge = Some(exempt);
                }
                Ok(None) => {}
                // The lockout stands: without the rule's answer the request is a stranger's.
                Err(err) => {
                    tracing::warn!(error.cause = %err, "lockout exemption unknown; the block stands");
                }
            }
        }
        let admitted = scopes
            .iter()
            .zip(&outcomes)
            .all(|(s, o)| o.allowed || !s.enforced);
        let consumed = admitted && request.consume;
        let outcomes: Vec<ScopeOutcome> = scopes
            .iter()
            .zip(outcomes)
            .map(|(scope, raw)| {
                let raw = if consumed {
                    raw
                } else {
                    raw.unconsumed(scope, request.cost)
                };
                self.outcome(scope, raw)
            })
            .collect();
        if matches!(self.hot, Hot::Redis(_)) && outcomes.iter().any(|o| o.enforced && !o.allowed) {
            let shared = Arc::new(outcomes.clone());
            for (scope, outcome) in scopes.iter().zip(&outcomes) {
                // A user blocked by a multiplier may be a locked account whose owner, in a
                // context the account knows, must get through: never answered from cache.
                let contextual = self.exemptions.get().is_some()
                    && is_user_scope(scope)
                    && outcome.multiplier <= 0.0;
                if outcome.enforced && !outcome.allowed && !contextual {
                    self.l1.remember(
                        &scope.bucket_key,
                        request.cost,
                        outcome.retry_after_ms,
                        &shared,
                        now_us,
                    );
                }
            }
        }
        let mut decision = self.conclude(class_name, outcomes, now_ms, false, false);
        decision.challenge = challenge;
        Ok(decision)
    }

    /// The raw outcome of every scope, from the hot store.
    async fn evaluate(
        &self,
        scopes: &[Scope],
        request: &LimitRequest,
        now_us: u64,
    ) -> Result<Vec<RawOutcome>, crate::store::Error> {
        match &self.hot {
            Hot::Memory(memory) => Ok(self.evaluate_memory(memory, scopes, request, now_us)),
            Hot::Redis(redis) => {
                let started = std::time::Instant::now();
                let result = redis_backend::evaluate(redis, &self.coalescer, scopes, request).await;
                metrics::histogram!(names::REDIS_LATENCY_SECONDS, "op" => "token_bucket")
                    .record(started.elapsed().as_secs_f64());
                result
            }
        }
    }

    fn l1_hit(&self, scopes: &[Scope], cost: u32, now_us: u64) -> Option<Vec<ScopeOutcome>> {
        scopes
            .iter()
            .filter(|s| s.enforced)
            .find_map(|s| self.l1.blocked(&s.bucket_key, cost, now_us))
            // The cached decision must be about the same set of scopes.
            .filter(|outcomes| outcomes.len() == scopes.len())
    }

    fn evaluate_memory(
        &self,
        memory: &MemoryHot,
        scopes: &[Scope],
        request: &LimitRequest,
        now_us: u64,
    ) -> Vec<RawOutcome> {
        let multipliers: Vec<(f64, Option<u64>)> = scopes
            .iter()
            .map(|s| match s.multiplier_override {
                Some(value) => (value, None),
                None => memory
                    .multiplier(&s.multiplier_key, now_us)
                    .map_or((s.default_multiplier, None), |(value, ttl_us)| {
                        (value.max(0.0), ttl_us)
                    }),
            })
            .collect();
        let keys: smallvec::SmallVec<[&str; 8]> =
            scopes.iter().map(|s| s.bucket_key.as_str()).collect();
        let cost = f64::from(request.cost);
        let now = now_us as f64;
        memory.update_buckets(&keys, now, |states, writes| {
            let verdicts: Vec<bucket::Verdict> = scopes
                .iter()
                .zip(states)
                .zip(&multipliers)
                .map(|((scope, state), (m, _))| {
                    let params = bucket::Params {
                        multiplier: *m,
                        ..scope.params
                    };
                    bucket::evaluate(*state, now, params, cost)
                })
                .collect();
            let admitted = scopes
                .iter()
                .zip(&verdicts)
                .all(|(s, v)| v.allowed || !s.enforced);
            for (write, v) in writes.iter_mut().zip(&verdicts) {
                *write = (admitted && request.consume && v.allowed).then_some(v.new_tat);
            }
            verdicts
                .iter()
                .zip(&multipliers)
                .map(|(v, (m, ttl_us))| RawOutcome {
                    allowed: v.allowed,
                    limit: (v.limit + 1e-9).floor() as u64,
                    remaining: v.remaining,
                    reset_ms: bucket::ceil_ms(v.reset_us),
                    retry_after_ms: v
                        .retry_after_us
                        .is_finite()
                        .then(|| bucket::ceil_ms(v.retry_after_us)),
                    multiplier: *m,
                    multiplier_ttl_ms: ttl_us.map(|us| us.div_ceil(1000)),
                })
                .collect()
        })
    }

    fn outcome(&self, scope: &Scope, raw: RawOutcome) -> ScopeOutcome {
        let budget = &self.budgets.budgets[scope.budget];
        let retry_after_ms = match raw.retry_after_ms {
            Some(ms) => ms,
            // Blocked by the multiplier: until it expires.
            None => raw
                .multiplier_ttl_ms
                .filter(|&ms| ms > 0)
                .unwrap_or(BLOCKED_RETRY_MS),
        };
        ScopeOutcome {
            budget: self.budgets.names[scope.budget].clone(),
            scope: budget.scope,
            subject: scope.subject.shared(),
            enforced: scope.enforced,
            allowed: raw.allowed,
            limit: raw.limit,
            remaining: raw.remaining,
            reset_ms: raw.reset_ms,
            retry_after_ms: if raw.allowed { 0 } else { retry_after_ms },
            multiplier: raw.multiplier,
            policy: (budget.limit, budget.period_s),
        }
    }

    fn degraded(
        &self,
        class: usize,
        class_name: Arc<str>,
        scopes: &[Scope],
        now_ms: i64,
        source: crate::store::Error,
    ) -> Result<Decision, Error> {
        let fail = self.budgets.classes[class].fail;
        let outcome_label = match fail {
            FailMode::Open => "fail_open",
            FailMode::Closed => "fail_closed",
        };
        metrics::counter!(names::FAIL_OPEN_TOTAL, "class" => class_name.to_string(), "outcome" => outcome_label)
            .increment(1);
        tracing::warn!(endpoint.class = %class_name, error.cause = %source, "hot store unavailable: {outcome_label}");
        match fail {
            FailMode::Closed => {
                metrics::counter!(names::LIMIT_DECISIONS_TOTAL, "class" => class_name.to_string(), "scope" => "none", "outcome" => outcome_label)
                    .increment(1);
                Err(Error::FailClosed {
                    class: class_name.to_string(),
                    source,
                })
            }
            FailMode::Open => {
                let outcomes = scopes
                    .iter()
                    .map(|scope| {
                        let budget = &self.budgets.budgets[scope.budget];
                        ScopeOutcome {
                            budget: self.budgets.names[scope.budget].clone(),
                            scope: budget.scope,
                            subject: scope.subject.shared(),
                            enforced: scope.enforced,
                            allowed: true,
                            limit: u64::from(budget.capacity()),
                            remaining: u64::from(budget.capacity()),
                            reset_ms: 0,
                            retry_after_ms: 0,
                            multiplier: 1.0,
                            policy: (budget.limit, budget.period_s),
                        }
                    })
                    .collect();
                Ok(self.conclude(class_name, outcomes, now_ms, true, false))
            }
        }
    }

    fn conclude(
        &self,
        class: Arc<str>,
        scopes: Vec<ScopeOutcome>,
        now_ms: i64,
        degraded: bool,
        cached: bool,
    ) -> Decision {
        let allowed = scopes.iter().all(|s| s.allowed || !s.enforced);
        let deciding = if allowed {
            let pool: Vec<usize> = if scopes.iter().any(|s| s.enforced) {
                (0..scopes.len()).filter(|&i| scopes[i].enforced).collect()
            } else {
                (0..scopes.len()).collect()
            };
            pool.into_iter()
                .min_by_key(|&i| (scopes[i].remaining, scopes[i].limit))
        } else {
            (0..scopes.len())
                .filter(|&i| scopes[i].enforced && !scopes[i].allowed)
                .max_by_key(|&i| (scopes[i].retry_after_ms, std::cmp::Reverse(i)))
        };
        let shadow_blocked: Vec<usize> = (0..scopes.len())
            .filter(|&i| !scopes[i].enforced && !scopes[i].allowed)
            .collect();
        let retry_after_ms = if allowed {
            0
        } else {
            deciding.map_or(0, |i| scopes[i].retry_after_ms)
        };
        let scope_label = deciding.map_or("none", |i| scopes[i].scope.as_str());
        let outcome = match (allowed, degraded, shadow_blocked.is_empty()) {
            (true, true, _) => "fail_open",
            (false, _, _) => "limited",
            (true, false, false) => "shadow_limited",
            (true, false, true) => "allowed",
        };
        metrics::counter!(names::LIMIT_DECISIONS_TOTAL, "class" => class.to_string(), "scope" => scope_label, "outcome" => outcome)
            .increment(1);
        if let Some(scope) = deciding.map(|i| &scopes[i])
            && scope.limit > 0
        {
            metrics::histogram!(names::LIMIT_REMAINING_RATIO, "class" => class.to_string())
                .record(scope.remaining as f64 / scope.limit as f64);
        }
        Decision {
            allowed,
            class,
            scopes,
            deciding,
            retry_after_ms,
            degraded,
            shadow_blocked,
            cached,
            challenge: None,
            now_ms,
        }
    }

    /// Publishes a multiplier for `subject`, for one endpoint class or (None) every class,
    /// read by the next bucket check on every instance. `ttl` None: until replaced.
    ///
    /// Written directly, beside scoring: scoring's publishes write (or delete) only the
    /// classes its factors set, so a key written here for another class stays until its TTL.
    pub async fn publish_multiplier(
        &self,
        subject: &SubjectKey,
        class: Option<&str>,
        value: f64,
        ttl: Option<Duration>,
    ) -> Result<(), crate::store::Error> {
        let value = if value.is_finite() {
            value.max(0.0)
        } else {
            0.0
        };
        let classes: Vec<&str> = match class {
            Some(class) => vec![class],
            None => self.budgets.classes.iter().map(|c| &*c.name).collect(),
        };
        let now_us = self.clock.monotonic_us();
        for class in classes {
            let key = self.keys.multiplier(subject, class);
            match &self.hot {
                Hot::Memory(memory) => {
                    memory.set_multiplier(
                        &key,
                        value,
                        now_us,
                        ttl.map(|t| u64::try_from(t.as_micros()).unwrap_or(u64::MAX)),
                    );
                }
                Hot::Redis(redis) => {
                    let mut cmd = redis::cmd("SET");
                    cmd.arg(&key).arg(value.to_string());
                    if let Some(ttl) = ttl {
                        cmd.arg("PX")
                            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1));
                    }
                    redis.query::<()>(&cmd).await?;
                }
            }
        }
        // A raised multiplier must not be hidden by a cached block on this instance.
        self.l1.clear();
        Ok(())
    }
}

/// A scope keyed by the request's user (or account).
fn is_user_scope(scope: &Scope) -> bool {
    scope.subject.kind() == crate::model::SubjectKind::User
}

/// True when the request was refused only by user scopes whose multiplier allows nothing
/// (a lockout, a deny entry): the case the lockout-DoS rule may lift. Any other blocking
/// scope (an IP's budget, a user's spent budget) refuses the request whatever the rule says.
fn blocked_only_by_user_multiplier(scopes: &[Scope], outcomes: &[RawOutcome]) -> bool {
    let mut blocking = scopes
        .iter()
        .zip(outcomes)
        .filter(|(s, o)| s.enforced && !o.allowed)
        .peekable();
    blocking.peek().is_some()
        && blocking.all(|(s, o)| is_user_scope(s) && o.retry_after_ms.is_none())
}

/// A multiplier as the bucket can use it: finite and not negative (NaN blocks).
fn sanitized(value: f64) -> f64 {
    if value.is_nan() {
        0.0
    } else {
        value.clamp(0.0, 1e6)
    }
}

impl RawOutcome {
    /// Backends report an allowed scope as if `cost` were taken; when nothing was taken
    /// (another scope denied, or `consume: false`) report the bucket as it is. Exact for
    /// `remaining` (cost is whole: ⌊x − c⌋ + c = ⌊x⌋); `reset_ms` within a millisecond.
    fn unconsumed(self, scope: &Scope, cost: u32) -> RawOutcome {
        if !self.allowed {
            return self;
        }
        let rate_per_ms = scope.params.refill_per_s * self.multiplier / 1000.0;
        let cost_ms = if rate_per_ms > 0.0 {
            f64::from(cost) / rate_per_ms
        } else {
            0.0
        };
        RawOutcome {
            remaining: self.remaining + u64::from(cost),
            reset_ms: (self.reset_ms as f64 - cost_ms).max(0.0).ceil() as u64,
            ..self
        }
    }
}

impl Limiter {
    /// Removes a subject's multiplier for one class or (None) every class: back to 1.
    pub async fn clear_multiplier(
        &self,
        subject: &SubjectKey,
        class: Option<&str>,
    ) -> Result<(), crate::store::Error> {
        let classes: Vec<&str> = match class {
            Some(class) => vec![class],
            None => self.budgets.classes.iter().map(|c| &*c.name).collect(),
        };
        for class in classes {
            let key = self.keys.multiplier(subject, class);
            match &self.hot {
                Hot::Memory(memory) => memory.clear_multiplier(&key),
                Hot::Redis(redis) => redis.query::<()>(redis::cmd("DEL").arg(&key)).await?,
            }
        }
        self.l1.clear();
        Ok(())
    }
}

/// What a backend reports per scope, before the limiter adds names.
#[derive(Debug, Clone, Copy)]
struct RawOutcome {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_ms: u64,
    /// None: never under the current multiplier.
    retry_after_ms: Option<u64>,
    multiplier: f64,
    /// Milliseconds until the multiplier expires, if it has an expiry.
    multiplier_ttl_ms: Option<u64>,
}
