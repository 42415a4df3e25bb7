//! Policy: what-if replays of the traffic record through a candidate `[limits]`, and runtime
//! overrides of one subject's multiplier.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiJson, ApiPath, ApiQuery, Authorized, ReasonQuery, parse_reason, role};
use super::lockouts::parse_time;
use super::request_id::current_request_id;
use crate::app::AppState;
use crate::policy::record::why_empty;
use crate::policy::replay::{Report, Signals, Window, replay_window};
use crate::scoring::overrides::Override;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(simulate))
        .routes(routes!(create_override, list_overrides))
        .routes(routes!(delete_override))
        .routes(routes!(load_canary))
        .routes(routes!(canary_report, discard_canary))
        .routes(routes!(last_canary))
        .routes(routes!(promote_canary))
        .routes(routes!(live_policy))
        .routes(routes!(revert_policy))
        .routes(routes!(export_rules))
}

/// `POST /v1/policy/simulate` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Simulate {
    /// The candidate as a settings file's TOML text; its `[limits]` is compared with the
    /// live one (other sections are ignored). At most 256 KiB.
    pub policy: String,
    /// From this RFC 3339 time (default: one hour before now).
    #[schema(format = DateTime)]
    pub from: Option<String>,
    /// Before this RFC 3339 time (default: now).
    #[schema(format = DateTime)]
    pub to: Option<String>,
    /// How scoring is modelled: `recorded` (default; each check's multipliers as the live
    /// limiter applied them) or `one` (every multiplier held at 1).
    pub signals: Option<String>,
}

/// Checks one simulation replays at most (longer windows: `palisade replay`).
const MAX_RECORDS: usize = 1_000_000;

/// Replays the recorded traffic of a window (at most one million checks) through the live
/// `[limits]` and a candidate's and reports the difference: per class, per deciding scope,
/// and the keys it changes most, with how far the replay of the live policy is from what the
/// live limiter answered (`recorded`, `refused_recorded`, `refused_replayed` per class); and
/// the window's stored logins (at most 100,000) through both `[lockout]`s under `logins`
/// (role `admin`). Needs `[record]` on for the checks; an empty window says why it may be
/// empty in `empty`.
#[utoipa::path(operation_id = "simulate_policy", post, path = "/v1/policy/simulate", tag = "admin", security(("bearer" = [])),
    request_body = Simulate,
    responses((status = 200, body = Object), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn simulate(
    _auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<Simulate>,
) -> Result<Json<Simulated>, ApiError> {
    if body.policy.len() > 256 * 1024 {
        return Err(ApiError::invalid("policy must be at most 256 KiB of TOML"));
    }
    let candidate = crate::config::Settings::candidate_toml(&body.policy)
        .map_err(|err| ApiError::invalid(format!("policy: {err}")))?;
    let now = app.clock.now_ms();
    let to_ms = parse_time("to", body.to.as_deref())?.unwrap_or(now + 1);
    let from_ms = parse_time("from", body.from.as_deref())?.unwrap_or(to_ms - 3_600_000);
    if from_ms >= to_ms {
        return Err(ApiError::invalid("from must be before to"));
    }
    let signals = match body.signals.as_deref() {
        None => Signals::Recorded,
        Some(text) => Signals::parse(text)
            .ok_or_else(|| ApiError::invalid("signals must be `recorded` or `one`"))?,
    };
    let live = app.canary.live_limits();
    let window = Window {
        from_ms,
        to_ms,
        max: MAX_RECORDS,
    };
    let mut report = replay_window(
        &app.stores.durable,
        (&live, &candidate.limits),
        window,
        signals,
        None,
        |_, _| {},
    )
    .await?;
    if report.requests == 0 {
        report.empty = Some(why_empty(&app.settings.record, from_ms, now));
    }
    let events =
        crate::policy::logins::read(&app.stores.durable, from_ms, to_ms, MAX_EVENTS).await?;
    let logins = if events.is_empty() {
        None
    } else {
        Some(
            crate::login_replay::replay(&app.settings, &candidate.lockout, &events)
                .await
                .map_err(|err| ApiError::internal(format!("the login replay failed: {err}")))?,
        )
    };
    Ok(Json(Simulated {
        report,
        logins,
        logins_truncated: events.len() as u32 >= MAX_EVENTS,
    }))
}

/// Auth events one simulation replays at most.
const MAX_EVENTS: u32 = 100_000;

/// What a simulation found.
#[derive(Debug, serde::Serialize)]
pub struct Simulated {
    /// The limit checks' report (flattened: `requests`, `classes`, `scopes`, `top_keys`, …).
    #[serde(flatten)]
    pub report: Report,
    /// The window's logins through both `[lockout]`s; absent without stored auth events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logins: Option<crate::policy::logins::LoginReport>,
    /// True when the window held more than 100,000 auth events (only the first were replayed).
    pub logins_truncated: bool,
}

/// `POST /v1/overrides` body: one of `account`, `ip`, `device_id`, `tenant`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewOverride {
    /// An account.
    pub account: Option<String>,
    /// An address (an IPv6 client's prefix, as the limiter keys it).
    pub ip: Option<String>,
    /// A device.
    pub device_id: Option<String>,
    /// A tenant: the override scales its `scope = "tenant"` budgets (raise a partner for a
    /// launch, cut a misbehaving app); the budgets of its users, devices and addresses stay.
    pub tenant: Option<String>,
    /// Classes it applies to (default: every class).
    #[serde(default)]
    pub classes: Vec<String>,
    /// The multiplier it sets, 0–1000 (beyond the class bounds; 0 blocks).
    pub multiplier: f64,
    /// When it ends, RFC 3339, within 90 days.
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// Why (1–500 characters; kept in the audit log and the explanation).
    pub reason: String,
}

/// An override.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct OverrideView {
    /// ULID.
    pub id: String,
    /// Subject key.
    pub subject: String,
    /// Classes (empty: every class).
    pub classes: Vec<String>,
    /// Multiplier it sets.
    pub multiplier: f64,
    /// RFC 3339.
    pub expires_at: String,
    /// Who set it and why.
    pub message: String,
}

impl From<Override> for OverrideView {
    fn from(o: Override) -> Self {
        OverrideView {
            id: o.id,
            subject: o.subject,
            classes: o.classes,
            multiplier: o.multiplier,
            expires_at: crate::clock::rfc3339(o.expires_at_ms),
            message: o.message,
        }
    }
}

/// The overrides in force.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct OverridePage {
    /// Newest first.
    pub items: Vec<OverrideView>,
}

/// Sets one subject's multiplier on some classes (or all) until a time, beyond the class
/// bounds, at once on every instance (role `admin`): raise a partner for a launch, cut a
/// misbehaving key. A lockout or deny entry still blocks; of two overrides the smaller wins.
/// Shown in every explanation; audited as `override.create`.
#[utoipa::path(post, path = "/v1/overrides", tag = "admin", security(("bearer" = [])),
    request_body = NewOverride,
    responses((status = 201, body = OverrideView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn create_override(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<NewOverride>,
) -> Result<(axum::http::StatusCode, Json<OverrideView>), ApiError> {
    let reason = parse_reason(Some(&body.reason))?;
    let subject = match body.tenant.as_deref() {
        Some(tenant) => {
            if body.account.is_some() || body.ip.is_some() || body.device_id.is_some() {
                return Err(ApiError::invalid(
                    "name exactly one of account, ip, device_id and tenant",
                ));
            }
            let live = app.limiter.budgets();
            if !live
                .budgets
                .iter()
                .any(|b| b.scope == crate::config::ScopeKind::Tenant)
            {
                return Err(ApiError::invalid(
                    "no budget is per tenant: a tenant's override scales budgets with scope = \"tenant\" ([[limits.budgets]])",
                ));
            }
            app.settings
                .http
                .identifiers()
                .tenant_key(tenant)
                .map_err(|e| ApiError::invalid(e.to_string()))?
        }
        None => super::extract::one_subject(
            &app,
            body.account.as_deref(),
            body.ip.as_deref(),
            body.device_id.as_deref(),
        )?,
    };
    if !(0.0..=1000.0).contains(&body.multiplier) || body.multiplier.is_nan() {
        return Err(ApiError::invalid("multiplier must be between 0 and 1000"));
    }
    if let Some(unknown) = body
        .classes
        .iter()
        .find(|c| !app.scoring.classes().contains(c))
    {
        return Err(ApiError::invalid(format!(
            "class {unknown:.64?} is not configured (classes: {})",
            app.scoring.classes().join(", ")
        )));
    }
    let now = app.clock.now_ms();
    let expires = parse_time("expires_at", Some(&body.expires_at))?
        .ok_or_else(|| ApiError::invalid("expires_at is required"))?;
    if expires <= now || expires > now + 90 * 86_400_000 {
        return Err(ApiError::invalid(
            "expires_at must be in the future and within 90 days",
        ));
    }
    let created = app
        .overrides
        .create(
            &subject,
            &crate::scoring::overrides::Spec {
                classes: body.classes,
                multiplier: body.multiplier,
                expires_at_ms: expires,
                reason,
            },
            &auth.caller.actor(),
            &current_request_id(),
        )
        .await?;
    Ok((axum::http::StatusCode::CREATED, Json(created.into())))
}

/// The overrides in force, newest first (role `analyst`).
#[utoipa::path(get, path = "/v1/overrides", tag = "analyst", security(("bearer" = [])),
    responses((status = 200, body = OverridePage), (status = 401, body = Envelope),
        (status = 403, body = Envelope)))]
async fn list_overrides(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
) -> Result<Json<OverridePage>, ApiError> {
    let items = app.overrides.list().await?;
    Ok(Json(OverridePage {
        items: items.into_iter().map(OverrideView::from).collect(),
    }))
}

/// Removes an override at once on every instance (role `admin`); `?reason=` is required and
/// audited as `override.delete`.
#[utoipa::path(delete, path = "/v1/overrides/{id}", tag = "admin", security(("bearer" = [])),
    params(("id" = String, Path, description = "override id"), ReasonQuery),
    responses((status = 200, body = OverrideView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn delete_override(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ReasonQuery>,
) -> Result<Json<OverrideView>, ApiError> {
    let reason = parse_reason(query.reason.as_deref())?;
    let not_found = || ApiError::not_found(format!("no override with id {id:.40?} in force"));
    if ulid::Ulid::from_string(&id).is_err() {
        return Err(not_found());
    }
    let removed = app
        .overrides
        .delete(&id, &reason, &auth.caller.actor(), &current_request_id())
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(removed.into()))
}

/// `POST /v1/policy/candidates` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCanary {
    /// The candidate as a settings file's TOML text (its `[limits]` runs). At most 256 KiB.
    pub policy: String,
    /// Why (1–500 characters; kept in the audit log).
    pub reason: String,
}

/// A loaded canary.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CanaryLoaded {
    /// Its id.
    pub id: String,
}

/// Loads a candidate `[limits]` as the canary: every instance runs it beside the live policy
/// within a second, never enforcing it, and counts where it would answer differently
/// (role `admin`). Replaces a canary in force; audited as `policy.canary_load`. 409 when its
/// classes differ from those in force (a promotion keeps them, so such a canary could never
/// be promoted).
#[utoipa::path(post, path = "/v1/policy/candidates", tag = "admin", security(("bearer" = [])),
    request_body = NewCanary,
    responses((status = 201, body = CanaryLoaded), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 409, body = Envelope),
        (status = 503, body = Envelope)))]
async fn load_canary(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<NewCanary>,
) -> Result<(axum::http::StatusCode, Json<CanaryLoaded>), ApiError> {
    let reason = parse_reason(Some(&body.reason))?;
    if body.policy.len() > 256 * 1024 {
        return Err(ApiError::invalid("policy must be at most 256 KiB of TOML"));
    }
    let id = app
        .canary
        .load(
            &body.policy,
            &reason,
            &auth.caller.actor(),
            &current_request_id(),
        )
        .await
        .map_err(canary_error)?;
    Ok((axum::http::StatusCode::CREATED, Json(CanaryLoaded { id })))
}

fn canary_error(err: crate::policy::canary::CanaryError) -> ApiError {
    use crate::policy::canary::CanaryError;
    match err {
        CanaryError::Invalid(message) => ApiError::invalid(message),
        CanaryError::Conflict(message) => ApiError::new(super::error::ErrorCode::Conflict, message),
        CanaryError::Store(store) => store.into(),
    }
}

/// `POST /v1/policy/candidates/current/promote` and `POST /v1/policy/live/revert` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyChange {
    /// Why (1–500 characters; kept in the audit log).
    pub reason: String,
}

/// Makes the canary in force the live policy of every instance within a second, kept across
/// restarts (role `admin`): its classes' patterns and budgets replace the settings file's
/// (the class names must stay the same; other `[limits]` settings stay the file's). The
/// canary ends. Audited as `policy.promote`. 404 without a canary, 409 when its classes
/// differ.
#[utoipa::path(operation_id = "promote_canary", post, path = "/v1/policy/candidates/current/promote", tag = "admin", security(("bearer" = [])),
    request_body = PolicyChange,
    responses((status = 200, body = crate::policy::canary::LiveStatus), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 404, body = Envelope),
        (status = 409, body = Envelope)))]
async fn promote_canary(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<PolicyChange>,
) -> Result<Json<crate::policy::canary::LiveStatus>, ApiError> {
    let reason = parse_reason(Some(&body.reason))?;
    app.canary
        .promote(&reason, &auth.caller.actor(), &current_request_id())
        .await
        .map_err(canary_error)?
        .ok_or_else(|| ApiError::not_found("no canary policy is in force"))?;
    Ok(Json(app.canary.live()))
}

/// Where the live `[limits]` come from: the settings file or a promoted canary (role
/// `analyst`).
#[utoipa::path(operation_id = "live_policy", get, path = "/v1/policy/live", tag = "analyst", security(("bearer" = [])),
    responses((status = 200, body = crate::policy::canary::LiveStatus), (status = 401, body = Envelope),
        (status = 403, body = Envelope)))]
async fn live_policy(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
) -> Json<crate::policy::canary::LiveStatus> {
    Json(app.canary.live())
}

/// Goes back to the settings file's `[limits]` on every instance within a second (role
/// `admin`); audited as `policy.revert`. 404 when nothing is promoted.
#[utoipa::path(operation_id = "revert_policy", post, path = "/v1/policy/live/revert", tag = "admin", security(("bearer" = [])),
    request_body = PolicyChange,
    responses((status = 200, body = crate::policy::canary::LiveStatus), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn revert_policy(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<PolicyChange>,
) -> Result<Json<crate::policy::canary::LiveStatus>, ApiError> {
    let reason = parse_reason(Some(&body.reason))?;
    if !app
        .canary
        .revert(&reason, &auth.caller.actor(), &current_request_id())
        .await?
    {
        return Err(ApiError::not_found("no promoted policy is in force"));
    }
    Ok(Json(app.canary.live()))
}

/// The canary in force and what this instance has counted of it: per live class, checks
/// answered alike, that it would refuse, that it would allow, and the deciding scopes of the
/// differences (role `analyst`). The fleet's counts are the Prometheus counter
/// `palisade_canary_decisions_total`. 404 when no canary is in force.
#[utoipa::path(get, path = "/v1/policy/candidates/current", tag = "analyst", security(("bearer" = [])),
    responses((status = 200, body = Object), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn canary_report(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
) -> Result<Json<crate::policy::canary::Report>, ApiError> {
    app.canary
        .report()
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no canary policy is in force"))
}

/// The last canary that ended, promoted or discarded, with its report as the instance that
/// ended it had counted it (the same report is in the audit entry of the promotion or the
/// discard) (role `analyst`). 404 when none has ended.
#[utoipa::path(get, path = "/v1/policy/candidates/last", tag = "analyst", security(("bearer" = [])),
    responses((status = 200, body = crate::policy::canary::Ended), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope), (status = 503, body = Envelope)))]
async fn last_canary(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
) -> Result<Json<crate::policy::canary::Ended>, ApiError> {
    app.canary
        .last()
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("no canary policy has ended"))
}

/// Discards the canary in force on every instance within a second (role `admin`);
/// `?reason=` is required; audited as `policy.canary_discard`. To make it the live policy,
/// promote it instead.
#[utoipa::path(delete, path = "/v1/policy/candidates/current", tag = "admin", security(("bearer" = [])),
    params(ReasonQuery),
    responses((status = 204), (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn discard_canary(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<ReasonQuery>,
) -> Result<axum::http::StatusCode, ApiError> {
    let reason = parse_reason(query.reason.as_deref())?;
    if app
        .canary
        .discard(&reason, &auth.caller.actor(), &current_request_id())
        .await?
    {
        Ok(axum::http::StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("no canary policy is in force"))
    }
}

/// The budgets and deny entries a CDN can enforce itself, in the provider's rule format
/// (role `admin`): `cloudflare` (rate limiting rules, custom rules and an IP list, JSON),
/// `aws-waf` (rate-based rules and IP sets, JSON), `fastly` (VCL). What the edge cannot
/// express (user- and device-keyed budgets, signed-in-only budgets, fallback classes,
/// multipliers, account and device deny entries) is listed in `not_expressed` (JSON) or as
/// comments (VCL).
#[utoipa::path(get, path = "/v1/export/{provider}", tag = "admin", security(("bearer" = [])),
    params(("provider" = String, Path, description = "cloudflare, aws-waf or fastly")),
    responses((status = 200, content_type = "application/json", body = Object),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn export_rules(
    _auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiPath(provider): ApiPath<String>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let provider = crate::integrations::export::Provider::parse(&provider).ok_or_else(|| {
        ApiError::not_found(format!(
            "no export for {provider:.32?}: cloudflare, aws-waf or fastly"
        ))
    })?;
    let deny = app.lists.entries(crate::reputation::lists::ListName::Deny);
    let exported = crate::integrations::export::export(provider, &app.canary.live_limits(), &deny);
    Ok((
        [(axum::http::header::CONTENT_TYPE, exported.content_type)],
        exported.body,
    )
        .into_response())
}
