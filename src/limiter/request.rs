//! What a check is asked and what it answers: the request, the multipliers known locally,
//! exemptions, the per-scope outcomes and the decision.

use std::sync::Arc;

use crate::config::ScopeKind;
use crate::model::{ClientIp, SubjectKey};

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
    /// Many honest users share the request's IP (`limits.shared_ip`): a request with a
    /// device id is counted per IP and device, under a raised IP-wide ceiling.
    pub shared_ip: bool,
    /// The request's network or ASN is blocked on this class (spraying from rotating
    /// addresses): its IP scopes block whatever is published for the address.
    pub ip_blocked: bool,
    /// The service-wide login guard is on and the request is a login (`auth`, naming an
    /// account): its IP scopes block unless the account knows the context.
    pub login_guard: bool,
    /// The request is a login from a network or ASN suspected of spraying: its IP scopes
    /// block unless the account knows the context (which then passes without a step-up).
    pub login_suspect: bool,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            ip: 1.0,
            user: 1.0,
            device: 1.0,
            shared_ip: false,
            ip_blocked: false,
            login_guard: false,
            login_suspect: false,
        }
    }
}

/// This region's leased shares of the budgets held across regions (the socket
/// `regions::shares::Shares` fills).
pub trait GlobalShares: Send + Sync + std::fmt::Debug {
    /// Which budget held across regions `budget` is (an index for [`GlobalShares::share`]).
    fn global(&self, budget: &str) -> Option<usize>;
    /// The share of global budget `global` this region spends for `subject` now; `cost`
    /// counts as demand for it, weighed against the budget's `refill_per_s`. For a class
    /// that fails closed (`fails_closed`), a region that could not renew its leases for
    /// longer than a lease spends next to nothing.
    fn share(
        &self,
        global: usize,
        subject: &str,
        cost: u32,
        refill_per_s: f64,
        fails_closed: bool,
    ) -> f64;
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
    /// The lockout the context is exempt from (None: a network's block or the guard).
    pub lockout_id: Option<String>,
    /// A login challenge's id, for a context the account does not know: the auth service
    /// reports it passed (`challenge_passed`), and the context becomes known.
    pub id: Option<String>,
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

    /// True when the request's account knows its context (asked only for a request refused
    /// by its network's block alone: the account's owner gets a challenge instead).
    fn known_context<'a>(
        &'a self,
        request: &'a LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>>;

    /// True when the request's account knows its device, or the device is attested (asked
    /// only for a request refused by a shared address's ceiling alone).
    fn known_device<'a>(
        &'a self,
        request: &'a LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>>;

    /// Notes a login the network's block or the login guard stopped from a context its
    /// account does not know (evidence that the attack goes on while it is stopped), and
    /// issues the login challenge it gets instead of a refusal: its id, or None when such
    /// logins are refused (`lockout.unknown_context = "refuse"`).
    fn unknown_context<'a>(
        &'a self,
        request: &'a LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<Option<String>, crate::store::Error>>;

    /// Notes a request of `class` naming an account that its address's or device's budget
    /// refused (a login's, when `class` is the login class and the account does not know
    /// the context: the accounts a source tries are spraying evidence, refused or not).
    fn refused_by_budget<'a>(
        &'a self,
        class: &'a str,
        request: &'a LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<(), crate::store::Error>>;
}

/// Which devices hold a fresh attestation verdict of device integrity or better.
///
/// The socket attestation plugs into (the limiter never imports it); asked only for requests
/// with a device id of classes with a per-endpoint IP budget.
pub trait AttestedDevices: Send + Sync + std::fmt::Debug {
    /// True when `device` is attested now.
    fn is_attested<'a>(
        &'a self,
        device: &'a SubjectKey,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>>;
}

/// What the limiter asks of the rooms above it, handed in when it is built
/// ([`Limiter::with_sockets`]; `app` wires them). A limiter without them checks budgets
/// alone, as a replay's does.
#[derive(Debug, Clone, Default)]
pub struct Sockets {
    /// Default multipliers (scoring).
    pub defaults: Option<Arc<dyn DefaultMultipliers>>,
    /// The lockout-DoS rule.
    pub exemptions: Option<Arc<dyn Exemptions>>,
    /// Which devices are attested: an attested device's requests get their own per-IP
    /// budgets (keyed by IP and device, under the IP-wide ceiling), as on a shared address.
    pub attested: Option<Arc<dyn AttestedDevices>>,
    /// Where refused and challenged decisions are kept.
    pub history: Option<Arc<dyn DecisionSink>>,
    /// Where the inputs of every check are recorded.
    pub recorder: Option<Arc<dyn TrafficSink>>,
}

impl Sockets {
    /// True when any socket is wired.
    pub(super) fn any(&self) -> bool {
        self.defaults.is_some()
            || self.exemptions.is_some()
            || self.attested.is_some()
            || self.history.is_some()
            || self.recorder.is_some()
    }
}

/// Where refused and challenged decisions go to be kept (the decision history); called
/// on the request path, so it must only note them and return.
pub trait DecisionSink: Send + Sync + std::fmt::Debug {
    /// Notes one refused or challenged decision for `request`.
    fn note(&self, request: &LimitRequest, decision: &Decision);
}

/// Where the inputs of every decided check go to be recorded (the traffic record for policy
/// replay); called on the request path, so it must only note them and return.
pub trait TrafficSink: Send + Sync + std::fmt::Debug {
    /// Notes one check and what was decided.
    fn note(&self, request: &LimitRequest, decision: &Decision);
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
    /// `tenant:…`: the partner or app the request is made for, as the gateway authenticated
    /// it (keys the `tenant` scope).
    pub tenant: Option<SubjectKey>,
    /// Who the message or notification goes to, canonical (keys the `recipient` and
    /// `destination` scopes).
    pub recipient: Option<RecipientKeys>,
    /// Tokens this request costs (≥ 1).
    pub cost: u32,
    /// False: answer without taking tokens.
    pub consume: bool,
}

/// The keys a message's recipient is limited by (`messaging::Recipient` makes them).
#[derive(Debug, Clone, PartialEq)]
pub struct RecipientKeys {
    /// `recipient:…`.
    pub key: SubjectKey,
    /// `destination:…`, if the recipient has one (not a push token).
    pub destination: Option<SubjectKey>,
    /// The multiplier of its destination budgets (a premium-rate number's fraction, else 1).
    pub destination_factor: f64,
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
    /// The IP-wide bucket of a shared address (`limits.shared_ip.ceiling` times the budget).
    pub shared_ceiling: bool,
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
    /// Allowed on condition of a step-up: the account is locked but knows this context
    /// (the lockout-DoS rule), or the login guard or the network's block stopped a context
    /// the account does not know (a login challenge with an id).
    pub challenge: Option<Challenge>,
    /// Refused by the service-wide login guard (a login from a context its account does not
    /// know while the service is under credential stuffing).
    pub login_guard: bool,
    /// Wall time of the decision, Unix ms (for `reset` in seconds).
    pub now_ms: i64,
}

/// What a prediction keeps of a decision: the answer, the class and the deciding scope
/// ([`Limiter::verdict_now`], [`Decision::verdict`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// As [`Decision::allowed`].
    pub allowed: bool,
    /// The endpoint class.
    pub class: Arc<str>,
    /// The deciding scope's kind and subject (as [`Decision::deciding_scope`] reports them).
    pub deciding: Option<(ScopeKind, Arc<str>)>,
}

impl Decision {
    /// The deciding scope, if any budget applied.
    pub fn deciding_scope(&self) -> Option<&ScopeOutcome> {
        self.deciding.map(|i| &self.scopes[i])
    }

    /// What a prediction keeps of it.
    pub fn verdict(&self) -> Verdict {
        Verdict {
            allowed: self.allowed,
            class: self.class.clone(),
            deciding: self.deciding_scope().map(|s| (s.scope, s.subject.clone())),
        }
    }

    /// A refusal's stable reason code, for the app to show a helpful message (it names what
    /// was limited, never which signal): `account_locked`, `account_rate`, `login_guard`,
    /// `ip_blocked`, `ip_shared_limit`, `ip_rate`, `device_blocked`, `device_untrusted`,
    /// `device_rate`, `tenant_rate`, `recipient_rate`, `destination_rate`, `busy` (the global
    /// budget). None when allowed.
    pub fn reason_code(&self) -> Option<&'static str> {
        if self.allowed {
            return None;
        }
        let scope = self.deciding_scope()?;
        let blocked = scope.multiplier <= 0.0;
        Some(match scope.scope {
            ScopeKind::Global => "busy",
            ScopeKind::User | ScopeKind::EndpointUser if blocked => "account_locked",
            ScopeKind::User | ScopeKind::EndpointUser => "account_rate",
            ScopeKind::Ip | ScopeKind::EndpointIp if blocked && self.login_guard => "login_guard",
            ScopeKind::Ip | ScopeKind::EndpointIp if blocked => "ip_blocked",
            ScopeKind::Ip | ScopeKind::EndpointIp if scope.shared_ceiling => "ip_shared_limit",
            ScopeKind::Ip | ScopeKind::EndpointIp => "ip_rate",
            ScopeKind::Device | ScopeKind::IpDevice if blocked => "device_blocked",
            ScopeKind::Device | ScopeKind::IpDevice if scope.multiplier < 1.0 => "device_untrusted",
            ScopeKind::Device | ScopeKind::IpDevice => "device_rate",
            ScopeKind::Tenant => "tenant_rate",
            ScopeKind::Recipient => "recipient_rate",
            ScopeKind::Destination => "destination_rate",
        })
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
