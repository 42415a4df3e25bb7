//! Envoy's rate limit service (v3 gRPC, `envoy.service.ratelimit.v3.RateLimitService`).
//!
//! Envoy (and Istio) call `ShouldRateLimit` with descriptors: lists of `(key, value)`
//! entries built by the route's rate-limit actions. Palisade reads the client IP, user,
//! device, path and method from the entries named in `[envoy]`, makes **one** check of
//! all its scopes (exactly what `POST /v1/limit/check` decides for the same request), and
//! answers every descriptor with the status of the scopes its entries name. The token
//! (role `limiter`) travels as gRPC metadata `authorization: Bearer <token>` (Envoy's
//! `grpc_service.initial_metadata`).
//!
//! The messages are written from Envoy's published API (`envoy/service/ratelimit/v3/rls.proto`,
//! `envoy/extensions/common/ratelimit/v3/ratelimit.proto`, `envoy/config/core/v3/base.proto`)
//! with the same field numbers, as `prost` derives: no code generation, no `protoc`. The
//! server glue below is what `tonic-build` would generate for this one unary method.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::server::NamedService;

use super::error::ErrorCode;
use super::extract::authorize;
use super::layer;
use super::limit::{LimitCheck, check_and_observe, parse};
use crate::access::Role;
use crate::app::AppState;
use crate::config::ScopeKind;
use crate::limiter::{Decision, ScopeOutcome};

/// The gRPC path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Envoy's messages (only the fields Palisade reads or writes; unknown fields are skipped
/// by protobuf decoding, as in any proto3 reader).
pub mod proto {
    /// `envoy.service.ratelimit.v3.RateLimitRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitRequest {
        /// Configuration domain (e.g. `envoy`); Palisade has one policy and ignores it.
        #[prost(string, tag = "1")]
        pub domain: String,
        /// The descriptors; the request is over limit if any is.
        #[prost(message, repeated, tag = "2")]
        pub descriptors: Vec<RateLimitDescriptor>,
        /// Hits this request adds (0 means 1): Palisade's `cost`.
        #[prost(uint32, tag = "3")]
        pub hits_addend: u32,
    }

    /// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitDescriptor {
        /// The entries.
        #[prost(message, repeated, tag = "1")]
        pub entries: Vec<Entry>,
        /// The route's own limit for this descriptor (Envoy's `limit` override): used instead
        /// of the configured rule of the domain.
        #[prost(message, optional, tag = "2")]
        pub limit: Option<RateLimitOverride>,
        /// A per-descriptor hits addend (`google.protobuf.UInt64Value`), overriding the
        /// request's. Sent by newer Envoy versions only; older ones leave field 3 unused, so
        /// it is simply absent there.
        #[prost(message, optional, tag = "3")]
        pub hits_addend: Option<UInt64Value>,
    }

    /// `RateLimitDescriptor.Entry`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Entry {
        /// Descriptor key.
        #[prost(string, tag = "1")]
        pub key: String,
        /// Descriptor value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// `RateLimitDescriptor.RateLimitOverride`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitOverride {
        /// Requests per unit.
        #[prost(uint32, tag = "1")]
        pub requests_per_unit: u32,
        /// `envoy.type.v3.RateLimitUnit` (the same numbers as [`Unit`]).
        #[prost(int32, tag = "2")]
        pub unit: i32,
    }

    /// `google.protobuf.UInt64Value`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct UInt64Value {
        /// The value.
        #[prost(uint64, tag = "1")]
        pub value: u64,
    }

    /// `envoy.service.ratelimit.v3.RateLimitResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimitResponse {
        /// OK or OVER_LIMIT, over all descriptors.
        #[prost(enumeration = "Code", tag = "1")]
        pub overall_code: i32,
        /// One per request descriptor, in order.
        #[prost(message, repeated, tag = "2")]
        pub statuses: Vec<DescriptorStatus>,
        /// Headers Envoy adds to the response to the client.
        #[prost(message, repeated, tag = "3")]
        pub response_headers_to_add: Vec<HeaderValue>,
        /// Headers Envoy adds to the request sent upstream.
        #[prost(message, repeated, tag = "4")]
        pub request_headers_to_add: Vec<HeaderValue>,
    }

    /// `RateLimitResponse.Code`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Code {
        /// Not known.
        Unknown = 0,
        /// Under the limit.
        Ok = 1,
        /// Over the limit.
        OverLimit = 2,
    }

    /// `RateLimitResponse.RateLimit`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RateLimit {
        /// Requests per unit.
        #[prost(uint32, tag = "1")]
        pub requests_per_unit: u32,
        /// The unit.
        #[prost(enumeration = "Unit", tag = "2")]
        pub unit: i32,
        /// Name: Palisade's budget name.
        #[prost(string, tag = "3")]
        pub name: String,
    }

    /// `RateLimitResponse.RateLimit.Unit`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Unit {
        /// Not known.
        Unknown = 0,
        /// Per second.
        Second = 1,
        /// Per minute.
        Minute = 2,
        /// Per hour.
        Hour = 3,
        /// Per day.
        Day = 4,
    }

    /// `RateLimitResponse.DescriptorStatus`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DescriptorStatus {
        /// This descriptor's code.
        #[prost(enumeration = "Code", tag = "1")]
        pub code: i32,
        /// The limit in force (multiplier applied).
        #[prost(message, optional, tag = "2")]
        pub current_limit: Option<RateLimit>,
        /// Tokens left.
        #[prost(uint32, tag = "3")]
        pub limit_remaining: u32,
        /// Until the bucket is full again.
        #[prost(message, optional, tag = "4")]
        pub duration_until_reset: Option<Duration>,
    }

    /// `google.protobuf.Duration`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Duration {
        /// Seconds.
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        /// Nanoseconds.
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }

    /// `envoy.config.core.v3.HeaderValue`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HeaderValue {
        /// Name.
        #[prost(string, tag = "1")]
        pub key: String,
        /// Value.
        #[prost(string, tag = "2")]
        pub value: String,
    }
}

use proto::{Code, DescriptorStatus, RateLimitRequest, RateLimitResponse};

/// What the entries of one descriptor name, as scope kinds.
fn scopes_named(state: &AppState, descriptor: &proto::RateLimitDescriptor) -> Vec<ScopeKind> {
    let envoy = &state.settings.envoy;
    let mut kinds = Vec::new();
    for entry in &descriptor.entries {
        let key = entry.key.as_str();
        if envoy.ip_keys.iter().any(|k| k == key) {
            kinds.extend([ScopeKind::Ip, ScopeKind::EndpointIp, ScopeKind::IpDevice]);
        } else if envoy.user_keys.iter().any(|k| k == key) {
            kinds.extend([ScopeKind::User, ScopeKind::EndpointUser]);
        } else if envoy.device_keys.iter().any(|k| k == key) {
            kinds.extend([ScopeKind::Device, ScopeKind::IpDevice]);
        } else if envoy.tenant_keys.iter().any(|k| k == key) {
            kinds.push(ScopeKind::Tenant);
        }
    }
    kinds
}

/// The request's check, assembled from every descriptor's entries. Without an entry naming
/// the client IP there is no check of Palisade's own (Ok(None)) when `rules_only` (the
/// domain has descriptor rules), an error otherwise.
fn limit_check(
    state: &AppState,
    request: &RateLimitRequest,
    rules_only: bool,
) -> Result<Option<LimitCheck>, tonic::Status> {
    let envoy = &state.settings.envoy;
    let mut check = LimitCheck {
        endpoint: String::new(),
        method: None,
        ip: String::new(),
        user_id: None,
        device_id: None,
        identity: None,
        tenant: None,
        cost: None,
        consume: None,
    };
    for entry in request.descriptors.iter().flat_map(|d| &d.entries) {
        let (key, value) = (entry.key.as_str(), entry.value.clone());
        if key == "identity" {
            check.identity = Some(value);
        } else if envoy.ip_keys.iter().any(|k| k == key) {
            check.ip = value;
        } else if envoy.user_keys.iter().any(|k| k == key) {
            check.user_id = Some(value);
        } else if envoy.device_keys.iter().any(|k| k == key) {
            check.device_id = Some(value);
        } else if envoy.tenant_keys.iter().any(|k| k == key) {
            check.tenant = Some(value);
        } else if envoy.path_keys.iter().any(|k| k == key) {
            check.endpoint = value;
        } else if envoy.method_keys.iter().any(|k| k == key) {
            check.method = Some(value);
        }
    }
    if check.ip.is_empty() {
        if rules_only {
            return Ok(None);
        }
        return Err(tonic::Status::invalid_argument(format!(
            "no descriptor entry names the client IP (keys {:?}: add a remote_address action)",
            envoy.ip_keys
        )));
    }
    if check.endpoint.is_empty() {
        check.endpoint.clone_from(&envoy.default_path);
    }
    let per_descriptor = request
        .descriptors
        .iter()
        .filter_map(|d| d.hits_addend.as_ref().map(|h| h.value))
        .max();
    let hits = per_descriptor
        .unwrap_or(u64::from(request.hits_addend))
        .max(1);
    check.cost = Some(u32::try_from(hits).map_err(|_| {
        tonic::Status::invalid_argument(format!("hits_addend {hits} is too large"))
    })?);
    Ok(Some(check))
}

/// The endpoint class of a request (its name and failure policy): the decision's when the
/// request had a check of Palisade's own, else from its path and method entries or the
/// default path.
fn class_of(
    state: &AppState,
    request: &RateLimitRequest,
    decision: Option<&Decision>,
) -> (std::sync::Arc<str>, crate::config::FailMode) {
    let budgets = state.limiter.budgets();
    if let Some(class) = decision.and_then(|d| budgets.classes.iter().find(|c| c.name == d.class)) {
        return (class.name.clone(), class.fail);
    }
    let envoy = &state.settings.envoy;
    let mut path = envoy.default_path.as_str();
    let mut method = "GET";
    for entry in request.descriptors.iter().flat_map(|d| &d.entries) {
        if envoy.path_keys.contains(&entry.key) {
            path = &entry.value;
        } else if envoy.method_keys.contains(&entry.key) {
            method = &entry.value;
        }
    }
    let class = &budgets.classes[budgets.classify(&method.to_ascii_uppercase(), path)];
    (class.name.clone(), class.fail)
}

/// The most telling scope among `kinds`: a blocking one (longest wait), else the one with
/// the fewest tokens left; the deciding scope when `kinds` names none.
fn scope_for<'d>(decision: &'d Decision, kinds: &[ScopeKind]) -> Option<&'d ScopeOutcome> {
    let candidates = decision
        .scopes
        .iter()
        .filter(|s| s.enforced && kinds.contains(&s.scope));
    let blocking = candidates
        .clone()
        .filter(|s| !s.allowed)
        .max_by_key(|s| s.retry_after_ms);
    blocking
        .or_else(|| candidates.min_by_key(|s| s.remaining))
        .or_else(|| decision.deciding_scope())
}

fn rate_limit(scope: &ScopeOutcome) -> proto::RateLimit {
    use proto::Unit;
    let (limit, window_s) = scope.policy;
    // The quota this client gets (multiplier applied), per the largest unit that divides
    // the budget's window.
    let quota = f64::from(limit) * scope.multiplier;
    let (unit, unit_s) = [
        (Unit::Day, 86_400),
        (Unit::Hour, 3_600),
        (Unit::Minute, 60),
        (Unit::Second, 1),
    ]
    .into_iter()
    .find(|(_, unit_s)| window_s >= *unit_s && window_s % unit_s == 0)
    .unwrap_or((Unit::Second, 1));
    let per_unit = quota * f64::from(unit_s) / f64::from(window_s.max(1));
    proto::RateLimit {
        requests_per_unit: (per_unit + 1e-9).floor().clamp(0.0, f64::from(u32::MAX)) as u32,
        unit: unit as i32,
        name: scope.budget.to_string(),
    }
}

fn status(scope: Option<&ScopeOutcome>, allowed: bool) -> DescriptorStatus {
    let code = if allowed { Code::Ok } else { Code::OverLimit };
    let Some(scope) = scope else {
        return DescriptorStatus {
            code: code as i32,
            ..DescriptorStatus::default()
        };
    };
    let reset_ms = scope.reset_ms;
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(rate_limit(scope)),
        limit_remaining: u32::try_from(scope.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(proto::Duration {
            seconds: i64::try_from(reset_ms / 1000).unwrap_or(i64::MAX),
            nanos: i32::try_from((reset_ms % 1000) * 1_000_000).unwrap_or(0),
        }),
    }
}

/// Answers one `ShouldRateLimit` call.
pub async fn should_rate_limit(
    state: &AppState,
    token: Option<&str>,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, tonic::Status> {
    authorize(state, token, Role::Limiter)
        .await
        .map_err(|err| match err.code() {
            ErrorCode::Unauthenticated => tonic::Status::unauthenticated(err.message()),
            ErrorCode::Forbidden => tonic::Status::permission_denied(err.message()),
            _ => tonic::Status::unavailable(err.message()),
        })?;
    let rules = state
        .envoy_rules
        .as_ref()
        .map(|live| live.current())
        .filter(|rules| rules.has_domain(&request.domain));
    let check = limit_check(state, request, rules.is_some())?;
    let limit_request = match check {
        Some(check) => Some(
            parse(state, check).map_err(|err| tonic::Status::invalid_argument(err.message()))?,
        ),
        None => None,
    };
    let decision = match &limit_request {
        None => None,
        Some(limit_request) => match check_and_observe(state, limit_request).await {
            Ok(decision) => Some(decision),
            Err(crate::limiter::Error::CostAboveCapacity { .. }) => {
                return Err(tonic::Status::invalid_argument(
                    "hits_addend exceeds what a budget can ever hold",
                ));
            }
            // Fails closed: over limit, marked degraded (Envoy's own failure_mode_deny only
            // covers Palisade being unreachable).
            Err(crate::limiter::Error::FailClosed { .. }) => {
                return Ok(RateLimitResponse {
                    overall_code: Code::OverLimit as i32,
                    statuses: request
                        .descriptors
                        .iter()
                        .map(|_| status(None, false))
                        .collect(),
                    response_headers_to_add: vec![
                        header(layer::DEGRADED_HEADER, "redis-unavailable"),
                        header("retry-after", "1"),
                    ],
                    request_headers_to_add: Vec::new(),
                });
            }
        },
    };
    let admitted = decision.as_ref().is_none_or(|d| d.allowed);
    let ruled = match &rules {
        Some(rules) => Some(
            super::envoy_rules::answer(
                state,
                rules,
                request,
                limit_request.as_ref(),
                class_of(state, request, decision.as_ref()),
                admitted,
            )
            .await?,
        ),
        None => None,
    };
    let statuses = request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, descriptor)| {
            if let Some(status) = ruled.as_ref().and_then(|r| r.statuses[i].clone()) {
                return status;
            }
            let Some(decision) = &decision else {
                // No rule and no check of Palisade's own: nothing limits it (as upstream).
                return status(None, true);
            };
            let kinds = scopes_named(state, descriptor);
            let scope = scope_for(decision, &kinds);
            let allowed = scope.is_none_or(|s| s.allowed || !s.enforced);
            // A descriptor naming no scope of ours carries the request's answer.
            status(
                scope,
                if kinds.is_empty() {
                    decision.allowed
                } else {
                    allowed
                },
            )
        })
        .collect();
    let mut response_headers_to_add: Vec<proto::HeaderValue> = decision
        .as_ref()
        .map(|decision| {
            layer::headers(decision)
                .iter()
                .filter_map(|(name, value)| Some(header(name.as_str(), value.to_str().ok()?)))
                .collect()
        })
        .unwrap_or_default();
    if let Some(ruled) = &ruled {
        let now_ms = state.clock.now_ms();
        rule_headers(
            &mut response_headers_to_add,
            ruled,
            decision.as_ref(),
            now_ms,
        );
    }
    let over_limit = !admitted || ruled.as_ref().is_some_and(|r| r.over_limit);
    // A challenge goes upstream too: the auth service asks for the step-up and reports it.
    let request_headers_to_add = match decision.as_ref().and_then(|d| d.challenge.as_ref()) {
        None => Vec::new(),
        Some(_) => response_headers_to_add
            .iter()
            .filter(|h| {
                h.key.eq_ignore_ascii_case(layer::CHALLENGE_HEADER)
                    || h.key.eq_ignore_ascii_case(layer::CHALLENGE_ID_HEADER)
            })
            .cloned()
            .collect(),
    };
    Ok(RateLimitResponse {
        overall_code: if over_limit {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses,
        response_headers_to_add,
        request_headers_to_add,
    })
}

/// `x-ratelimit-limit`, `-remaining` and `-reset` name the most limiting of the rules and
/// Palisade's deciding scope (fewest tokens left), the reset in Unix seconds as Palisade's
/// own; a degraded rule check is marked.
fn rule_headers(
    headers: &mut Vec<proto::HeaderValue>,
    ruled: &super::envoy_rules::RuleAnswer,
    decision: Option<&Decision>,
    now_ms: i64,
) {
    if ruled.degraded {
        headers.push(header(layer::DEGRADED_HEADER, "redis-unavailable"));
    }
    let Some(tightest) = &ruled.tightest else {
        return;
    };
    let palisade_left = decision
        .and_then(Decision::deciding_scope)
        .map(|s| s.remaining);
    if palisade_left.is_some_and(|left| left <= u64::from(tightest.limit_remaining)) {
        return;
    }
    headers.retain(|h| !h.key.starts_with("x-ratelimit-"));
    let limit = tightest
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset_ms = tightest.duration_until_reset.as_ref().map_or(0, |d| {
        d.seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(d.nanos / 1_000_000))
    });
    let at_ms = now_ms.saturating_add(reset_ms);
    let reset_s = at_ms.div_euclid(1000) + i64::from(at_ms.rem_euclid(1000) > 0);
    headers.push(header("x-ratelimit-limit", &limit.to_string()));
    headers.push(header(
        "x-ratelimit-remaining",
        &tightest.limit_remaining.to_string(),
    ));
    headers.push(header("x-ratelimit-reset", &reset_s.to_string()));
}

fn header(key: &str, value: &str) -> proto::HeaderValue {
    proto::HeaderValue {
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

/// The gRPC service (what `tonic-build` generates for a one-method service).
#[derive(Clone)]
pub struct RateLimitService {
    state: AppState,
}

impl std::fmt::Debug for RateLimitService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RateLimitService")
    }
}

impl RateLimitService {
    /// The service over an app.
    pub fn new(state: AppState) -> Self {
        Self { state }
    }
}

impl NamedService for RateLimitService {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

struct ShouldRateLimit(AppState);

impl tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<tonic::Response<RateLimitResponse>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let token = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim().to_owned());
            let started = std::time::Instant::now();
            let span = tracing::info_span!("grpc", method = "ShouldRateLimit");
            let answer = tracing::Instrument::instrument(
                should_rate_limit(&state, token.as_deref(), request.get_ref()),
                span,
            )
            .await;
            let outcome = match &answer {
                Ok(r) if r.overall_code == Code::Ok as i32 => "ok",
                Ok(_) => "over_limit",
                Err(_) => "error",
            };
            grpc_metrics::record(outcome, started.elapsed().as_secs_f64());
            answer.map(tonic::Response::new)
        })
    }
}

/// Every call's count and latency, their handles looked up once (the registry lookup of a
/// labelled `metrics::counter!` builds and hashes its key on every call).
mod grpc_metrics {
    use std::sync::{LazyLock, OnceLock};

    use crate::telemetry::metrics as names;

    static CALLS: LazyLock<names::Handles<&'static str, metrics::Counter>> =
        LazyLock::new(names::Handles::new);
    static SECONDS: OnceLock<metrics::Histogram> = OnceLock::new();

    /// Counts a call by its outcome and records how long it took.
    pub(super) fn record(outcome: &'static str, seconds: f64) {
        CALLS.with(
            outcome,
            || metrics::counter!(names::GRPC_REQUESTS_TOTAL, "outcome" => outcome),
            |calls| calls.increment(1),
        );
        SECONDS
            .get_or_init(|| metrics::histogram!(names::GRPC_REQUEST_SECONDS))
            .record(seconds);
    }
}

impl<B> tower::Service<axum::http::Request<B>> for RateLimitService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = axum::http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let path = request.uri().path().to_owned();
            return Box::pin(async move {
                Ok(tonic::Status::unimplemented(format!("no method {path}")).into_http())
            });
        }
        let method = ShouldRateLimit(self.state.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// Serves the rate limit service on a bound listener until `shutdown` completes.
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    // No Nagle delay on answers: a small response held back for the peer's delayed ACK
    // costs each call tens of milliseconds when calls share a connection.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let (reporter, health) = tonic_health::server::health_reporter();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let watched = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => report_health(&watched, &reporter).await,
                _ = stopped.changed() => return,
            }
        }
    });
    // Server reflection (v1 and v1alpha: grpcurl, grpcio, Postman) of the three services.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_file_descriptor_set(super::envoy_descriptor::rate_limit_service())
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let (reflection_v1, reflection_v1alpha) =
        match (reflection().build_v1(), reflection().build_v1alpha()) {
            (Ok(v1), Ok(v1alpha)) => (Some(v1), Some(v1alpha)),
            (Err(err), _) | (_, Err(err)) => {
                tracing::error!(error.cause = %err, "gRPC reflection not served");
                (None, None)
            }
        };
    let served = tonic::transport::Server::builder()
        .add_service(health)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_service(RateLimitService::new(state))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    let _ = stop.send(true);
    served
}

/// `grpc.health.v1.Health`: the server (`""`) and the rate limit service are `SERVING` while
/// both stores answer (as `/readyz`), `NOT_SERVING` otherwise; `Watch` streams the changes.
async fn report_health(state: &AppState, reporter: &tonic_health::server::HealthReporter) {
    let (durable, hot) = tokio::join!(state.stores.durable.ping(), state.stores.hot.ping());
    let status = if durable.is_ok() && hot.is_ok() {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    for service in ["", RateLimitService::NAME] {
        reporter.set_service_status(service, status).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As for the JSON check: the future every `ShouldRateLimit` call allocates stays small.
    #[test]
    fn a_should_rate_limit_future_stays_small() {
        let size = crate::api::future_size(
            |(state, token, request): (
                &'static AppState,
                Option<&'static str>,
                &'static RateLimitRequest,
            )| { should_rate_limit(state, token, request) },
        );
        assert!(size < 4096, "a ShouldRateLimit future is {size} bytes");
    }
}
