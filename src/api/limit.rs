//! `POST /v1/limit/check` (role `limiter`): may this request pass?

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope, ErrorCode};
use super::extract::{ApiJson, Authorized, role};
use super::layer;
use crate::app::AppState;
use crate::limiter::{self, Decision, LimitRequest};
use crate::model::ClientIp;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(check))
}

/// `POST /v1/limit/check` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitCheck {
    /// Path of the protected request, e.g. `/auth/login`, as the client sent it: it is
    /// canonicalised before classification (query dropped, decoded, dot segments resolved,
    /// slashes collapsed, `;` parameters and a trailing slash dropped, case ignored). At
    /// most 2048 bytes before the query; NUL and control characters are refused.
    #[schema(pattern = "^/")]
    pub endpoint: String,
    /// HTTP method of the protected request; default `GET`.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z]{1,16}$")]
    pub method: Option<String>,
    /// Client IP (IPv4, IPv6 or IPv4-mapped IPv6).
    #[schema(schema_with = super::schema::ip)]
    pub ip: String,
    /// The authenticated user (or the account, on auth endpoints): makes the request count as
    /// authenticated.
    #[serde(default)]
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    pub user_id: Option<String>,
    /// The device.
    #[serde(default)]
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    pub device_id: Option<String>,
    /// A signed identity `v1.<exp>.<uid>.<did>.<sig>` or `v2.<exp>.<uid>.<did>.<tid>.<sig>`
    /// (docs/GUIDE.md). With `forward_auth.identity_secret` set, user, device and tenant come
    /// only from it (`user_id`, `device_id` and `tenant` are ignored); a missing, expired or
    /// forged one makes the request anonymous and tenantless.
    #[serde(default)]
    #[schema(max_length = 2048)]
    pub identity: Option<String>,
    /// The tenant the request is made for (a partner, customer or app, as the gateway
    /// authenticated it, e.g. from an API key): keys budgets with `scope = "tenant"` and the
    /// tenant's overrides. Ignored with `forward_auth.identity_secret` set (a v2 identity
    /// signs it).
    #[serde(default)]
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    pub tenant: Option<String>,
    /// Who the message or notification the request makes the backend send goes to (an OTP
    /// by SMS, an e-mail, a push): a phone number, an e-mail address or a push token, in any
    /// spelling (`tel:`, `mailto:` or `push:` name the kind; otherwise it is inferred). Keys
    /// the `recipient` and `destination` budgets (docs/GUIDE.md, "Messages and push").
    #[serde(default)]
    #[schema(max_length = 512)]
    pub recipient: Option<String>,
    /// Tokens the request costs, 1..=`limits.max_cost`; default 1.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub cost: Option<u32>,
    /// False: answer without taking tokens; default true.
    #[serde(default)]
    pub consume: Option<bool>,
}

/// An allowed check.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LimitAllowed {
    /// Always true here (a denial is a 429 envelope).
    pub allowed: bool,
    /// Effective capacity of the deciding scope.
    pub limit: u64,
    /// Tokens left in the deciding scope.
    pub remaining: u64,
    /// Unix seconds at which the deciding scope is full again.
    pub reset: i64,
    /// Always 0 here.
    pub retry_after_ms: u64,
    /// Deciding scope: `global`, `ip`, `user`, `device`, `endpoint_ip`, `endpoint_user`,
    /// `ip_device`, `tenant`, `recipient`, `destination`.
    pub scope: String,
    /// Deciding budget's name.
    pub budget: String,
    /// Endpoint class of the request.
    pub class: String,
    /// Multiplier of the deciding scope's subject for this class.
    pub multiplier: f64,
    /// True when decided without the hot store (fail-open).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub degraded: bool,
    /// Shadow budgets that would have blocked this request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadow_blocked: Vec<String>,
    /// Present when the request passes on condition of a step-up (also sent as
    /// `X-Palisade-Challenge`, and the id as `X-Palisade-Challenge-Id`): `known_context`,
    /// the account is locked but knows this context (a recent login from this device, IP or
    /// network, or an attested device); `login_guard`, `network_blocked` or
    /// `network_spraying`, a login from a context the account does not know while the
    /// service is under credential stuffing or its network is blocked or suspected for
    /// spraying. A login challenge carries an `id`: the auth
    /// service reports it as `challenge_passed` once the person passed the step-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub challenge: Option<ChallengeView>,
}

/// Why an allowed request should be challenged.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChallengeView {
    /// `known_context`, `login_guard`, `network_blocked` or `network_spraying`.
    pub code: String,
    /// A sentence.
    pub message: String,
    /// The lockout the context is exempt from (absent for a network's block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockout_id: Option<String>,
    /// A login challenge's id (`login_guard`, `network_blocked`, `network_spraying`), valid
    /// `lockout.challenge_ttl_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

pub(super) fn parse(app: &AppState, body: LimitCheck) -> Result<LimitRequest, ApiError> {
    let limits = &app.settings.limits;
    let ids = app.settings.http.identifiers();
    limiter::target::validate(&body.endpoint).map_err(|e| ApiError::invalid(e.to_string()))?;
    let method = body
        .method
        .unwrap_or_else(|| "GET".to_owned())
        .to_ascii_uppercase();
    if method.is_empty() || method.len() > 16 || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ApiError::invalid(
            "method must be an HTTP method such as GET or POST",
        ));
    }
    let ip = ClientIp::parse(&body.ip, limits.ipv6_prefix_len).ok_or_else(|| {
        ApiError::invalid(format!(
            "ip {:.64?} is not an IPv4 or IPv6 address",
            body.ip
        ))
    })?;
    let (user_id, device_id, tenant) = if app.settings.forward_auth.identity_secret.is_empty() {
        (body.user_id, body.device_id, body.tenant)
    } else {
        let now_s = app.clock.now_ms() / 1000;
        match crate::access::identity::verify(
            &app.settings.forward_auth.identity_secret,
            body.identity.as_deref(),
            now_s,
        ) {
            Ok(identity) => {
                metrics::counter!(crate::telemetry::metrics::IDENTITY_CHECKS_TOTAL, "outcome" => "valid")
                    .increment(1);
                (identity.user, identity.device, identity.tenant)
            }
            Err(invalid) => {
                metrics::counter!(crate::telemetry::metrics::IDENTITY_CHECKS_TOTAL, "outcome" => invalid.as_str())
                    .increment(1);
                (None, None, None)
            }
        }
    };
    let user = user_id
        .map(|id| ids.user_key("user_id", &id))
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let device = device_id
        .map(|id| ids.device_key(&id))
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let tenant = tenant
        .as_deref()
        .map(|id| ids.tenant_key(id))
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let recipient = body
        .recipient
        .as_deref()
        .map(|raw| app.messaging.recipients().parse(raw))
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))?
        .map(Into::into);
    let cost = body.cost.unwrap_or(1);
    if cost == 0 || cost > limits.max_cost {
        return Err(ApiError::invalid(format!(
            "cost must be between 1 and {}",
            limits.max_cost
        )));
    }
    Ok(LimitRequest {
        method,
        endpoint: body.endpoint,
        ip,
        user,
        device,
        tenant,
        recipient,
        cost,
        consume: body.consume.unwrap_or(true),
    })
}

/// Rate-limit decision for one request (role `limiter`).
///
/// Checks every applicable scope (global, IP, user, device, endpoint+IP, endpoint+user) at
/// once and consumes `cost` from all or none; the strictest scope decides. Both answers carry
/// `X-RateLimit-Limit/Remaining/Reset`, `RateLimit-Policy` and `RateLimit`; a 429 also carries
/// `Retry-After` and `details.retry_after_ms` (exact). When Redis is down, fail-open classes
/// answer 200 with `X-Palisade-Degraded: redis-unavailable`, fail-closed classes 503.
#[utoipa::path(operation_id = "limit_check", post, path = "/v1/limit/check", tag = "limiter", security(("bearer" = [])),
    request_body = LimitCheck,
    responses(
        (status = 200, body = LimitAllowed),
        (status = 400, body = Envelope), (status = 401, body = Envelope), (status = 403, body = Envelope),
        (status = 429, body = Envelope), (status = 503, body = Envelope),
    ))]
async fn check(
    _auth: Authorized<role::Limiter>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<LimitCheck>,
) -> Result<(HeaderMap, Json<LimitAllowed>), ApiError> {
    let request = parse(&app, body)?;
    respond(&check_and_observe(&app, &request).await?)
}

/// Decides a request and feeds the decision to scoring (baselines, repeat offenders): what
/// `/v1/limit/check`, forward-auth and Envoy's service all do. A scoring failure never
/// changes the answer already decided.
pub(super) async fn check_and_observe(
    app: &AppState,
    request: &LimitRequest,
) -> Result<Decision, limiter::Error> {
    let decision = app.limiter.check(request).await?;
    app.canary.observe(request, &decision);
    if let Err(err) = app.scoring.observe_check(request, &decision).await {
        tracing::warn!(error.cause = %err, "scoring could not record a limit decision");
    }
    Ok(decision)
}

pub(super) fn respond(decision: &Decision) -> Result<(HeaderMap, Json<LimitAllowed>), ApiError> {
    let headers = layer::headers(decision);
    if !decision.allowed {
        let mut error = ApiError::new(ErrorCode::RateLimited, "Too many requests")
            .with_details(layer::denial_details(decision));
        for (name, value) in &headers {
            error = error.with_header(name.clone(), value.clone());
        }
        return Err(error);
    }
    let scope = decision.deciding_scope();
    Ok((
        headers,
        Json(LimitAllowed {
            allowed: true,
            limit: scope.map_or(0, |s| s.limit),
            remaining: scope.map_or(0, |s| s.remaining),
            reset: layer::reset_unix_s(decision),
            retry_after_ms: 0,
            scope: scope.map_or("none", |s| s.scope.as_str()).to_owned(),
            budget: scope.map_or_else(String::new, |s| s.budget.to_string()),
            class: decision.class.to_string(),
            multiplier: scope.map_or(1.0, |s| s.multiplier),
            degraded: decision.degraded,
            shadow_blocked: decision
                .shadow_blocked
                .iter()
                .map(|&i| decision.scopes[i].budget.to_string())
                .collect(),
            challenge: decision.challenge.as_ref().map(|c| ChallengeView {
                code: c.reason.code.clone(),
                message: c.reason.message.clone(),
                lockout_id: c.lockout_id.clone(),
                id: c.id.clone(),
            }),
        }),
    ))
}

impl From<limiter::Error> for ApiError {
    fn from(err: limiter::Error) -> Self {
        match err {
            limiter::Error::CostAboveCapacity { .. } => ApiError::invalid(err.to_string()),
            limiter::Error::FailClosed {
                ref class,
                ref source,
            } => {
                let cause = source.to_string();
                ApiError::new(
                    ErrorCode::Unavailable,
                    format!("rate limiter unavailable; class {class} fails closed"),
                )
                .with_details(
                    serde_json::json!({ "class": class, "degraded": "redis-unavailable" }),
                )
                .with_header(
                    axum::http::HeaderName::from_static(layer::DEGRADED_HEADER),
                    axum::http::HeaderValue::from_static("redis-unavailable"),
                )
                .with_header(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from_static("1"),
                )
                .with_cause(cause)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rare paths of a decision (tightening an anomalous key reaches both stores) are boxed,
    /// so that the future every check allocates stays small.
    #[test]
    fn a_checks_future_stays_small() {
        let size = crate::api::future_size(|(auth, state, body)| check(auth, state, body));
        assert!(size < 4096, "a limit check's future is {size} bytes");
    }
}
