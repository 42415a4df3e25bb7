//! Auth events and account status (role `ingest`).

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope, ErrorCode};
use super::extract::{ApiJson, ApiPath, ApiQuery, Authorized, JsonBody, role};
use super::request_id::current_request_id;
use crate::app::AppState;
use crate::clock::rfc3339;
use crate::ingest::{self, Limits};
use crate::lockout::{AccountStatus, Action, LoginContext, Reason};
use crate::model::{ClientIp, SubjectKey};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(post_auth_events))
        .routes(routes!(post_request_events))
        .routes(routes!(account_status))
}

/// `POST /v1/events/auth` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthBatch {
    /// 1–1000 events `{event_id, type: login_failure|login_success|challenge_passed, account,
    /// ip, device_id?, endpoint?, ts?, challenge_id?}` (`ts` RFC 3339; absent = time of
    /// receipt; at most 24 h old or 5 min ahead; `challenge_id` with `challenge_passed` only).
    #[schema(value_type = Vec<AuthEventDoc>, min_items = 1, max_items = 1000)]
    pub events: Vec<Box<serde_json::value::RawValue>>,
}

/// One auth event (the batch is parsed event by event, so one bad event is reported with its
/// index instead of failing the whole body).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: `ingest::parse_auth_batch` reads the events
pub struct AuthEventDoc {
    /// Idempotency key: a retried event counts once.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,128}$")]
    event_id: String,
    /// `login_failure`, `login_success`, or `challenge_passed`: the person passed the
    /// step-up of a login challenge (`challenge_id`), and the context becomes known to the
    /// account (not a login: no window counts it).
    #[schema(
        rename = "type",
        pattern = "^(login_failure|login_success|challenge_passed)$"
    )]
    kind: String,
    /// The account tried.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    account: String,
    /// The client's IP.
    #[schema(schema_with = super::schema::ip)]
    ip: String,
    /// The device, if known.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    device_id: Option<String>,
    /// The login endpoint.
    #[schema(max_length = 2048)]
    endpoint: Option<String>,
    /// When it happened (RFC 3339); absent = time of receipt; at most 24 h old or 5 min ahead.
    #[schema(format = DateTime)]
    ts: Option<String>,
    /// With `challenge_passed` (required there, refused elsewhere): the id of the login
    /// challenge the limit check answered (`challenge.id`, `X-Palisade-Challenge-Id`),
    /// issued for this account within `lockout.challenge_ttl_s`; else 400.
    #[schema(pattern = "^[0-9A-Za-z]{1,64}$")]
    challenge_id: Option<String>,
}

/// One served request (telemetry).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: `ingest::parse_request_batch` reads the events
pub struct RequestEventDoc {
    /// When it was served (RFC 3339); absent = time of receipt; at most 24 h old or 5 min
    /// ahead.
    #[schema(format = DateTime)]
    ts: Option<String>,
    /// The client's IP.
    #[schema(schema_with = super::schema::ip)]
    ip: String,
    /// The user, if authenticated.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    user_id: Option<String>,
    /// The device, if known.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    device_id: Option<String>,
    /// The path served.
    #[schema(pattern = "^/", max_length = 2048)]
    endpoint: String,
    /// The HTTP status answered.
    #[schema(minimum = 100, maximum = 599)]
    status: u16,
}

/// What to do for one account.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Decision {
    /// The account.
    pub account: String,
    /// `none`, `challenge` or `lockout`.
    pub action: Action,
    /// RFC 3339, when locked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked_until: Option<String>,
    /// Why.
    pub reasons: Vec<Reason>,
}

/// An accepted batch.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuthAccepted {
    /// Events stored by this call.
    pub accepted: u64,
    /// Events stored before (same `event_id`); counted once.
    pub duplicates: u64,
    /// Per account of the batch, for its latest IP/device.
    pub decisions: Vec<Decision>,
}

fn limits(app: &AppState) -> Limits {
    Limits {
        ids: app.settings.http.identifiers(),
        ipv6_prefix_len: app.settings.limits.ipv6_prefix_len,
    }
}

/// 1 to [`ingest::MAX_AUTH_BATCH`] events.
fn check_batch_len(len: usize) -> Result<(), ApiError> {
    if len == 0 {
        return Err(ApiError::invalid("events must hold at least one event"));
    }
    if len > ingest::MAX_AUTH_BATCH {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "at most {} events per batch; got {len}",
                ingest::MAX_AUTH_BATCH
            ),
        ));
    }
    Ok(())
}

/// Posts a batch of login failures/successes (role `ingest`). Idempotent by `event_id`.
///
/// A 2xx means every event is durably stored. A bad event rejects the batch with
/// `details.errors: [{index, reason}]` and stores nothing; more than 1000 events is 413.
#[utoipa::path(post, path = "/v1/events/auth", tag = "ingest", security(("bearer" = [])),
    request_body = AuthBatch,
    responses(
        (status = 200, body = AuthAccepted),
        (status = 400, body = Envelope), (status = 401, body = Envelope), (status = 403, body = Envelope),
        (status = 409, body = Envelope), (status = 413, body = Envelope), (status = 503, body = Envelope),
    ))]
async fn post_auth_events(
    auth: Authorized<role::Ingest>,
    State(app): State<AppState>,
    JsonBody(body): JsonBody,
) -> Result<Json<AuthAccepted>, ApiError> {
    // One pass over the body when every event is well-formed (the usual case); otherwise
    // the body again, event by event, so each malformed event is reported with its index.
    // (That event-by-event path, alone before, scanned every body twice and copied each
    // event.)
    let (count, parsed) = match serde_json::from_slice::<ingest::RawAuthBatch>(&body) {
        Ok(batch) => {
            let count = batch.events.len();
            check_batch_len(count)?;
            let parsed =
                ingest::validate_auth_batch(batch.events, app.ingest.now_ms(), limits(&app));
            (count, parsed)
        }
        Err(_) => {
            let axum::Json(batch) = axum::Json::<AuthBatch>::from_bytes(&body)?;
            check_batch_len(batch.events.len())?;
            let parsed = ingest::parse_auth_batch(&batch.events, app.ingest.now_ms(), limits(&app));
            (batch.events.len(), parsed)
        }
    };
    let events = parsed.map_err(|errors| {
        ApiError::invalid(format!(
            "{} of {} events are invalid; nothing was stored",
            errors.len(),
            count
        ))
        .with_details(serde_json::json!({ "errors": errors }))
    })?;
    // A login success makes its IP, network and device known to the account for
    // `known_for_days` (they get a challenge at worst during a lockout): from a token that is
    // not the auth service's, that is an act worth a record.
    if auth.caller.role != crate::access::Role::Ingest {
        let successes: Vec<&str> = events
            .iter()
            .filter(|e| e.kind == ingest::AuthKind::LoginSuccess)
            .map(|e| e.context.account_name.as_str())
            .collect();
        if !successes.is_empty() {
            tracing::warn!(token.name = %auth.caller.name, count = successes.len(), "login successes posted with a token of role {}", auth.caller.role.as_str());
            app.audit
                .record(
                    &auth.caller.actor(),
                    "auth_event.success",
                    successes[0],
                    serde_json::json!({ "count": successes.len(), "accounts": &successes[..successes.len().min(20)] }),
                    &current_request_id(),
                )
                .await?;
        }
    }
    let outcome = app.ingest.auth_events(events).await?;
    Ok(Json(AuthAccepted {
        accepted: outcome.accepted,
        duplicates: outcome.duplicates,
        decisions: outcome
            .decisions
            .into_iter()
            .map(|(account, status)| Decision {
                account,
                action: status.action,
                locked_until: status.locked_until_ms.map(rfc3339),
                reasons: status.reasons,
            })
            .collect(),
    }))
}

/// `POST /v1/events/requests` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestBatch {
    /// Optional idempotency key (1–128 printable characters): a retried batch with the same
    /// id counts nothing twice.
    #[serde(default)]
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,128}$")]
    pub batch_id: Option<String>,
    /// 1–5000 events `{ts?, ip, user_id?, device_id?, endpoint, status}` (`ts` RFC 3339;
    /// absent = time of receipt; at most 24 h old or 5 min ahead).
    #[schema(value_type = Vec<RequestEventDoc>, min_items = 1, max_items = 5000)]
    pub events: Vec<serde_json::Value>,
}

/// An accepted telemetry batch.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RequestsAccepted {
    /// Events counted by this call.
    pub accepted: usize,
    /// True when this `batch_id` was stored before (nothing counted twice).
    pub duplicate: bool,
    /// Keys this batch made anomalous (tightened for the cooling period, one alert each).
    pub anomalies: usize,
}

/// Posts a batch of request telemetry (role `limiter`): what the gateway served, for the
/// per-key baselines (anomalies) and 429 counts (repeat offenders).
///
/// A 2xx means the batch is durably stored (one row per batch, kept
/// `scoring.telemetry_retention_hours`). A bad event rejects the batch with
/// `details.errors: [{index, reason}]`; more than 5000 events is 413.
#[utoipa::path(post, path = "/v1/events/requests", tag = "scoring", security(("bearer" = [])),
    request_body = RequestBatch,
    responses(
        (status = 200, body = RequestsAccepted),
        (status = 400, body = Envelope), (status = 401, body = Envelope), (status = 403, body = Envelope),
        (status = 413, body = Envelope), (status = 503, body = Envelope),
    ))]
async fn post_request_events(
    _auth: Authorized<role::Limiter>,
    State(app): State<AppState>,
    ApiJson(batch): ApiJson<RequestBatch>,
) -> Result<Json<RequestsAccepted>, ApiError> {
    use crate::ingest::requests::{MAX_REQUEST_BATCH, parse_request_batch};
    if batch.events.is_empty() {
        return Err(ApiError::invalid("events must hold at least one event"));
    }
    if batch.events.len() > MAX_REQUEST_BATCH {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "at most {MAX_REQUEST_BATCH} events per batch; got {}",
                batch.events.len()
            ),
        ));
    }
    if let Some(id) = &batch.batch_id
        && (id.is_empty() || id.len() > 128 || id.chars().any(char::is_control))
    {
        return Err(ApiError::invalid(
            "batch_id must be 1-128 printable characters",
        ));
    }
    let events = parse_request_batch(&batch.events, app.ingest.now_ms(), limits(&app)).map_err(
        |errors| {
            ApiError::invalid(format!(
                "{} of {} events are invalid; nothing was stored",
                errors.len(),
                batch.events.len()
            ))
            .with_details(serde_json::json!({ "errors": errors }))
        },
    )?;
    let body = serde_json::to_string(&batch.events).unwrap_or_default();
    let outcome = app
        .ingest
        .requests(batch.batch_id.as_deref(), &events, &body)
        .await?;
    Ok(Json(RequestsAccepted {
        accepted: outcome.accepted,
        duplicate: outcome.duplicate,
        anomalies: outcome.anomalies,
    }))
}

/// The endpoint class whose IP signals the account status reports.
const AUTH_CLASS: &str = "auth";

/// `GET /v1/accounts/{account}/status` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {
    /// The client IP of the login attempt.
    #[param(schema_with = super::schema::ip)]
    pub ip: String,
    /// The device, if known.
    pub device_id: Option<String>,
}

/// Account status for one login attempt.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatusView {
    /// The account.
    pub account: String,
    /// `none`, `challenge` or `lockout`.
    pub action: Action,
    /// RFC 3339, when locked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked_until: Option<String>,
    /// The lockout's id, if the account is locked (also when this context only gets a challenge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockout_id: Option<String>,
    /// Failures of the account in the window.
    pub failures_in_window: u32,
    /// Why.
    pub reasons: Vec<Reason>,
    /// What the limiter holds against the attempt's IP on the `auth` class (spraying,
    /// reputation, deny lists), so the auth service can act on it too; absent when no
    /// `auth` class is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_signals: Option<IpSignals>,
}

/// The IP's multiplier on the `auth` class and its reasons.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct IpSignals {
    /// The IP's multiplier on `auth` (0 blocks, 1 is the plain budget).
    pub multiplier: f64,
    /// Reason codes of the enforced factors, e.g. `spraying`, `reputation_tor`, `list_deny`.
    pub reasons: Vec<String>,
}

/// What the auth service must do for this login attempt (role `ingest`). Served from the
/// hot store only (no SQL per login).
#[utoipa::path(get, path = "/v1/accounts/{account}/status", tag = "ingest", security(("bearer" = [])),
    params(("account" = String, Path, description = "account name", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$"), StatusParams),
    responses((status = 200, body = StatusView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn account_status(
    _auth: Authorized<role::Ingest>,
    State(app): State<AppState>,
    ApiPath(account): ApiPath<String>,
    ApiQuery(params): ApiQuery<StatusParams>,
) -> Result<Json<StatusView>, ApiError> {
    let limits = limits(&app);
    let ip = ClientIp::parse(&params.ip, limits.ipv6_prefix_len)
        .ok_or_else(|| ApiError::invalid(format!("ip {:.64?} is not an IP address", params.ip)))?;
    let account = limits
        .ids
        .account("account", &account)
        .map_err(|e| ApiError::invalid(e.to_string()))?
        .into_owned();
    let context = LoginContext {
        account: SubjectKey::user(&account, usize::MAX)
            .map_err(|e| ApiError::invalid(e.to_string()))?,
        account_name: account.clone(),
        ip_key: SubjectKey::ip(&ip),
        ip,
        device: params
            .device_id
            .as_deref()
            .map(|d| limits.ids.device_key(d))
            .transpose()
            .map_err(|e| ApiError::invalid(e.to_string()))?,
    };
    let status: AccountStatus = app.lockouts.status(&context).await?;
    let ip_signals = if app.scoring.classes().iter().any(|c| c == AUTH_CLASS) {
        let explained = app
            .scoring
            .explain(AUTH_CLASS, &[(context.ip_key.clone(), Some(ip.addr()))])
            .await?;
        explained.into_iter().next().map(|ip| IpSignals {
            multiplier: ip.combined.multiplier,
            reasons: ip
                .combined
                .contributions
                .iter()
                .filter(|c| !c.shadow)
                .map(|c| c.code.clone())
                .collect(),
        })
    } else {
        None
    };
    Ok(Json(StatusView {
        ip_signals,
        account,
        action: status.action,
        locked_until: status.locked_until_ms.map(rfc3339),
        lockout_id: status.lockout_id,
        failures_in_window: status.failures_in_window,
        reasons: status.reasons,
    }))
}
