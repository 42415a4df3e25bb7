//! Layered token buckets: which budgets apply to a request, and checking them all at once.
//!
//! Owns the bucket reference model ([`bucket`], pure; read it first), classes and budgets
//! ([`budgets`]), the canonical request target ([`target`]), the in-process and Redis
//! backends and the L1 cache of blocked buckets. Reads multipliers published by scoring from
//! the hot store; never imports `scoring`. Does not know HTTP: `api::layer` is its `tower`
//! middleware and header rendering.

pub mod bucket;
pub mod budgets;
mod calls;
mod cluster;
mod degraded;
mod l1;
mod lift;
mod matching;
mod memory_backend;
mod multipliers;
pub mod rates;
mod redis_backend;
mod request;
mod rules;
mod scopes;
mod script;
pub mod target;
mod verdict;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::{FailMode, LimitSettings, ScopeKind};
use crate::store::{Hot, Keys};
use crate::telemetry::metrics as names;

pub use budgets::Budgets;
pub use request::{
    AttestedDevices, Challenge, Decision, DecisionSink, DefaultMultipliers, Defaults, Error,
    Exemptions, GlobalShares, LimitRequest, RecipientKeys, ScopeOutcome, Sockets, TrafficSink,
    Verdict,
};
pub use rules::{RuleBucket, RuleOutcome};
use scopes::{Scope, sanitized};

/// `retry_after_ms` reported for a bucket blocked by a multiplier that has no expiry
/// (e.g. a manual deny): ask again in a minute.
pub const BLOCKED_RETRY_MS: u64 = 60_000;

/// The limiter service.
#[derive(Debug)]
pub struct Limiter {
    /// The budget table in force (a promoted policy swaps it whole; one check reads one).
    budgets: arc_swap::ArcSwap<Budgets>,
    keys: Keys,
    hot: Hot,
    clock: Arc<dyn Clock>,
    /// Shared with whoever must clear it ([`Limiter::l1_clearer`]).
    l1: Arc<l1::L1>,
    /// `limits.shared_ip.ceiling`.
    shared_ceiling: f64,
    coalescer: redis_backend::Coalescer,
    /// What it asks of the rooms above it.
    sockets: Sockets,
    /// The hot store is being rebuilt after it lost its data (lockouts and factors not back
    /// yet): classes that fail closed do.
    rebuilding: std::sync::atomic::AtomicBool,
    metrics: Metrics,
    /// Decisions per class and minute, for the console.
    rates: rates::Rates,
    /// False for a limiter that only predicts (a replay, a canary): its decisions are not
    /// counted in the decision metrics or the console's rates.
    observed: bool,
    /// This region's leased shares of the budgets held across regions (`[regions]`).
    shares: Option<Arc<dyn GlobalShares>>,
}

/// The handles of the metrics every check records, but for those of each class
/// ([`budgets::ClassMetrics`]).
#[derive(Debug, Default)]
struct Metrics {
    redis_latency: std::sync::OnceLock<metrics::Histogram>,
    /// Checks answered from the L1 cache (a hot blocked key: every request of a flood).
    l1_hits: std::sync::OnceLock<metrics::Counter>,
}

impl Limiter {
    /// Decisions per class and minute in this process over the last day.
    pub fn rates(&self) -> &rates::Rates {
        &self.rates
    }

    /// A limiter over the hot store with the effective `[limits]` settings.
    pub fn new(settings: &LimitSettings, hot: Hot, keys: Keys, clock: Arc<dyn Clock>) -> Self {
        let budgets = Budgets::from_settings(settings);
        let rates = rates::Rates::new(budgets.classes.iter().map(|c| &*c.name));
        let coalescer = redis_backend::Coalescer::new(
            match &hot {
                Hot::Redis(redis) => Some(redis),
                Hot::Memory(_) => None,
            },
            settings.coalesce,
            settings.coalesce_in_flight.into(),
        );
        Self {
            budgets: arc_swap::ArcSwap::from_pointee(budgets),
            keys,
            hot,
            clock,
            l1: Arc::new(l1::L1::new(Duration::from_millis(settings.l1_ttl_ms))),
            shared_ceiling: settings.shared_ip.ceiling,
            coalescer,
            sockets: Sockets::default(),
            rebuilding: std::sync::atomic::AtomicBool::new(false),
            metrics: Metrics::default(),
            rates,
            observed: true,
            shares: None,
        }
    }

    /// The same limiter, asking `sockets` of the rooms above it.
    pub fn with_sockets(mut self, sockets: Sockets) -> Self {
        self.sockets = sockets;
        self
    }

    /// The same limiter, spending this region's leased shares of the budgets held across
    /// regions (`regions.global_budgets`).
    pub fn with_shares(mut self, shares: Arc<dyn GlobalShares>) -> Self {
        self.shares = Some(shares);
        self
    }

    /// The same limiter, its decisions counted nowhere (a replay's or a canary's: they
    /// predict, they do not decide).
    pub fn unobserved(mut self) -> Self {
        self.observed = false;
        self
    }

    /// While `on`, the hot store lacks lockouts and factors it lost (`crate::recovery`): a
    /// class that fails closed answers as when the hot store is down.
    pub fn set_rebuilding(&self, on: bool) {
        self.rebuilding
            .store(on, std::sync::atomic::Ordering::Release);
    }

    /// Forgets every cached blocked bucket of this instance (a multiplier changed).
    pub fn clear_l1(&self) {
        self.l1.clear();
    }

    /// What clears this limiter's L1 cache, for a room below it that publishes multipliers
    /// (it holds the cache, not the limiter).
    pub fn l1_clearer(&self) -> impl Fn() + Send + Sync + 'static {
        let l1 = self.l1.clone();
        move || l1.clear()
    }

    /// The classes and budgets in force.
    pub fn budgets(&self) -> Arc<Budgets> {
        self.budgets.load_full()
    }

    /// Whether `settings` names the classes in force (Err names the difference).
    pub fn same_classes(&self, settings: &LimitSettings) -> Result<(), String> {
        let next = Budgets::from_settings(settings);
        let current = self.budgets.load_full();
        let names = |b: &Budgets| {
            let mut names: Vec<String> = b.classes.iter().map(|c| c.name.to_string()).collect();
            names.sort();
            names
        };
        if names(&next) == names(&current) {
            return Ok(());
        }
        Err(format!(
            "a promotion keeps the classes in force ({}), the candidate has {}: change classes in the settings file",
            names(&current).join(", "),
            names(&next).join(", ")
        ))
    }

    /// Puts another budget table in force (a promoted policy), from the next check on. Its
    /// classes must be the ones in force (their names key metrics, rates and scoring):
    /// Err names the difference.
    pub fn set_budgets(&self, settings: &LimitSettings) -> Result<(), String> {
        self.same_classes(settings)?;
        let next = Budgets::from_settings(settings);
        self.budgets.store(Arc::new(next));
        self.l1.clear();
        Ok(())
    }

    /// Consumes `cost` tokens from every scope of the request, or from none.
    ///
    /// The strictest scope decides and is the one reported. `retry_after_ms` is when that
    /// bucket will hold `cost` tokens again, not an estimate. When the hot store fails, the
    /// class's failure policy answers: fail-open allows (`degraded`), fail-closed errors.
    pub async fn check(&self, request: &LimitRequest) -> Result<Decision, Error> {
        let decision = self.decide(request).await?;
        if let Some(recorder) = self.sockets.recorder.as_ref() {
            recorder.note(request, &decision);
        }
        if (!decision.allowed || decision.challenge.is_some())
            && let Some(history) = self.sockets.history.as_ref()
        {
            history.note(request, &decision);
        }
        Ok(decision)
    }

    async fn decide(&self, request: &LimitRequest) -> Result<Decision, Error> {
        // An `Arc`, not a guard: this is held across the hot store's round trip, and a guard
        // held that long takes one of the thread's few `ArcSwap` debt slots. With a check per
        // connection in flight the slots run out, and every other `ArcSwap` load on the thread
        // (metric handles, range lists, multiplier defaults) takes the slow path.
        let budgets = self.budgets.load_full();
        let budgets: &Budgets = &budgets;
        let class = budgets.classify(&request.method, &request.endpoint);
        let class_name = budgets.classes[class].name.clone();
        let class_metrics = budgets.classes[class].metrics.clone();
        let attested = self.attested(budgets, class, request).await;
        let scopes = self.scopes(budgets, class, request, attested);
        affordable(budgets, &scopes, request.cost)?;
        let now_ms = self.clock.now_ms();
        let now_us = self.clock.monotonic_us();

        if matches!(self.hot, Hot::Redis(_))
            && request.consume
            && let Some(outcomes) = self.l1_hit(&scopes, request.cost, now_us)
        {
            self.metrics
                .l1_hits
                .get_or_init(|| metrics::counter!(names::LIMIT_L1_HITS_TOTAL))
                .increment(1);
            return Ok(self.conclude((class_name, &class_metrics), outcomes, now_ms, false, true));
        }

        if self.rebuilding.load(std::sync::atomic::Ordering::Acquire)
            && budgets.classes[class].fail == FailMode::Closed
        {
            let source = crate::store::Error::Unavailable {
                store: "hot",
                source: "it is being rebuilt after losing its data".into(),
            };
            return self.degraded(budgets, class, class_name, &scopes, now_ms, source);
        }
        let mut scopes = scopes;
        let mut outcomes = match self.evaluate(&scopes, request, now_us).await {
            Ok(outcomes) => outcomes,
            Err(source) => {
                return self.degraded(budgets, class, class_name, &scopes, now_ms, source);
            }
        };
        // The lockout-DoS rule: a block it may lift is re-checked without it.
        let lifted = self
            .lift(&class_name, request, &mut scopes, &outcomes)
            .await;
        let challenge = lifted.clone().flatten();
        if lifted.is_some() {
            outcomes = match self.evaluate(&scopes, request, now_us).await {
                Ok(outcomes) => outcomes,
                Err(source) => {
                    return self.degraded(budgets, class, class_name, &scopes, now_ms, source);
                }
            };
        }
        self.note_budget_refusal(&class_name, request, &scopes, &outcomes)
            .await;
        let outcomes: Vec<ScopeOutcome> = settled(&scopes, &outcomes, request)
            .map(|(scope, raw)| self.outcome(budgets, scope, raw))
            .collect();
        if matches!(self.hot, Hot::Redis(_)) && outcomes.iter().any(|o| o.enforced && !o.allowed) {
            let shared = Arc::new(outcomes.clone());
            for (scope, outcome) in scopes.iter().zip(&outcomes) {
                // A user blocked by a multiplier may be a locked account whose owner, in a
                // context the account knows, must get through, and a shared address's ceiling
                // and a tightened destination let known devices by: never answered from cache.
                let contextual = self.sockets.exemptions.as_ref().is_some()
                    && ((is_user_scope(scope) && outcome.multiplier <= 0.0)
                        || scope.network_blocked
                        || (scope.scale > 1.0 && lift::is_ip_scope(scope))
                        || (scope.kind == ScopeKind::Destination
                            && outcome.multiplier < scope.default_multiplier));
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
        let mut decision =
            self.conclude((class_name, &class_metrics), outcomes, now_ms, false, false);
        decision.login_guard = !decision.allowed && scopes.iter().any(|s| s.guarded);
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
            Hot::Memory(memory) => Ok(self
                .evaluate_memory(memory, scopes, request, now_us)
                .into_vec()),
            Hot::Redis(redis) => {
                let started = std::time::Instant::now();
                let result = redis_backend::evaluate(redis, &self.coalescer, scopes, request).await;
                self.metrics
                    .redis_latency
                    .get_or_init(|| {
                        metrics::histogram!(names::REDIS_LATENCY_SECONDS, "op" => "token_bucket")
                    })
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

    fn outcome(&self, budgets: &Budgets, scope: &Scope, raw: RawOutcome) -> ScopeOutcome {
        let budget = &budgets.budgets[scope.budget];
        ScopeOutcome {
            budget: budgets.names[scope.budget].clone(),
            scope: scope.kind,
            subject: scope.reported_subject(),
            enforced: scope.enforced,
            allowed: raw.allowed,
            limit: raw.limit,
            remaining: raw.remaining,
            reset_ms: raw.reported_reset_ms(),
            retry_after_ms: raw.reported_retry_after_ms(),
            multiplier: raw.multiplier,
            shared_ceiling: scope.scale > 1.0,
            policy: (
                (f64::from(budget.limit) * scope.scale).min(f64::from(u32::MAX)) as u32,
                budget.period_s,
            ),
        }
    }

    /// The decision from the scopes' outcomes, counted in `class`'s metrics (its name and
    /// handles).
    fn conclude(
        &self,
        (class, class_metrics): (Arc<str>, &budgets::ClassMetrics),
        scopes: Vec<ScopeOutcome>,
        now_ms: i64,
        degraded: bool,
        cached: bool,
    ) -> Decision {
        let (allowed, deciding) = deciding(&scopes, |s| Standing {
            enforced: s.enforced,
            allowed: s.allowed,
            remaining: s.remaining,
            limit: s.limit,
            retry_after_ms: s.retry_after_ms,
        });
        let shadow_blocked: Vec<usize> = (0..scopes.len())
            .filter(|&i| !scopes[i].enforced && !scopes[i].allowed)
            .collect();
        let retry_after_ms = if allowed {
            0
        } else {
            deciding.map_or(0, |i| scopes[i].retry_after_ms)
        };
        // A replay's or a canary's predictions are counted nowhere.
        if self.observed {
            let scope_label = deciding.map_or("none", |i| scopes[i].scope.as_str());
            let outcome = match (allowed, degraded, shadow_blocked.is_empty()) {
                (true, true, _) => "fail_open",
                (false, _, _) => "limited",
                (true, false, false) => "shadow_limited",
                (true, false, true) => "allowed",
            };
            class_metrics.decisions.with(
                (scope_label, outcome),
                || metrics::counter!(names::LIMIT_DECISIONS_TOTAL, "class" => class.to_string(), "scope" => scope_label, "outcome" => outcome),
                |counter| counter.increment(1),
            );
            self.rates.record(&class, self.clock.now_ms(), allowed);
            if let Some(scope) = deciding.map(|i| &scopes[i])
                && scope.limit > 0
            {
                class_metrics
                    .remaining
                    .get_or_init(|| metrics::histogram!(names::LIMIT_REMAINING_RATIO, "class" => class.to_string()))
                    .record(scope.remaining as f64 / scope.limit as f64);
            }
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
            login_guard: false,
            now_ms,
        }
    }
}

/// Err when `cost` exceeds what an enforced scope's budget can ever hold.
fn affordable(budgets: &Budgets, scopes: &[Scope], cost: u32) -> Result<(), Error> {
    for scope in scopes.iter().filter(|s| s.enforced) {
        let budget = &budgets.budgets[scope.budget];
        if cost > budget.capacity() {
            return Err(Error::CostAboveCapacity {
                cost,
                capacity: budget.capacity(),
                budget: budget.name.clone(),
            });
        }
    }
    Ok(())
}

/// Each scope with its outcome as reported: when nothing was taken (another scope refused,
/// or `consume: false`), an allowed bucket as it is, not as if `cost` were taken.
fn settled<'s>(
    scopes: &'s [Scope],
    outcomes: &'s [RawOutcome],
    request: &LimitRequest,
) -> impl Iterator<Item = (&'s Scope, RawOutcome)> + 's {
    let admitted = scopes
        .iter()
        .zip(outcomes)
        .all(|(s, o)| o.allowed || !s.enforced);
    let consumed = admitted && request.consume;
    let cost = request.cost;
    scopes.iter().zip(outcomes).map(move |(scope, &raw)| {
        let raw = if consumed {
            raw
        } else {
            raw.unconsumed(scope, cost)
        };
        (scope, raw)
    })
}

/// What deciding needs of one scope's outcome.
#[derive(Debug, Clone, Copy)]
struct Standing {
    enforced: bool,
    allowed: bool,
    remaining: u64,
    limit: u64,
    retry_after_ms: u64,
}

/// Whether every enforced scope allowed, and the deciding scope's index: the blocking one
/// with the longest wait, or when allowed the one with the fewest tokens left (among the
/// enforced scopes, or every scope when none is enforced).
fn deciding<T>(scopes: &[T], standing: impl Fn(&T) -> Standing) -> (bool, Option<usize>) {
    let at = |i: usize| standing(&scopes[i]);
    let allowed = scopes
        .iter()
        .map(&standing)
        .all(|s| s.allowed || !s.enforced);
    let deciding = if allowed {
        let any_enforced = scopes.iter().map(&standing).any(|s| s.enforced);
        (0..scopes.len())
            .filter(|&i| at(i).enforced || !any_enforced)
            .min_by_key(|&i| (at(i).remaining, at(i).limit))
    } else {
        (0..scopes.len())
            .filter(|&i| at(i).enforced && !at(i).allowed)
            .max_by_key(|&i| (at(i).retry_after_ms, std::cmp::Reverse(i)))
    };
    (allowed, deciding)
}

/// A scope keyed by the request's user (or account).
fn is_user_scope(scope: &Scope) -> bool {
    matches!(scope.kind, ScopeKind::User | ScopeKind::EndpointUser)
}

impl RawOutcome {
    /// `retry_after_ms` as reported: 0 when allowed; blocked by the multiplier, until it
    /// expires (or [`BLOCKED_RETRY_MS`] without an expiry).
    fn reported_retry_after_ms(&self) -> u64 {
        if self.allowed {
            return 0;
        }
        match self.retry_after_ms {
            Some(ms) => ms,
            None => self
                .multiplier_ttl_ms
                .filter(|&ms| ms > 0)
                .unwrap_or(BLOCKED_RETRY_MS),
        }
    }

    /// `reset_ms` as reported: for a denied scope never before it lets a request through. A
    /// bucket blocked by its multiplier (a lockout, a deny entry) refills at the rate times
    /// zero: whatever the bucket's own arithmetic says, it is full again no sooner than the
    /// multiplier lifts, so `Retry-After`, `RateLimit` `t`, `X-RateLimit-Reset` and the body's
    /// `reset` name one instant or later ones, never an earlier one.
    fn reported_reset_ms(&self) -> u64 {
        if self.allowed {
            self.reset_ms
        } else {
            self.reset_ms.max(self.reported_retry_after_ms())
        }
    }

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

#[cfg(test)]
mod tests;
