//! Lockouts for analysts (role `analyst`): list, inspect, release.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{
    ApiJson, ApiPath, ApiQuery, Authorized, parse_cursor, parse_limit, parse_since, role,
};
use super::request_id::current_request_id;
use crate::app::AppState;
use crate::clock::rfc3339;
use crate::lockout::{Lockout, LockoutEvent, Query, Status};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_lockouts))
        .routes(routes!(get_lockout))
        .routes(routes!(release_lockout))
}

/// A lockout.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LockoutView {
    /// Id (ULID).
    pub id: String,
    /// Account.
    pub account: String,
    /// `account`.
    pub scope: String,
    /// Reason code.
    pub reason: String,
    /// Failures in the window when created.
    pub failures: u32,
    /// Escalation level.
    pub level: u32,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub locked_until: String,
    /// RFC 3339, if released.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
    /// Who released it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_by: Option<String>,
    /// Why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_reason: Option<String>,
}

impl From<Lockout> for LockoutView {
    fn from(l: Lockout) -> Self {
        LockoutView {
            id: l.id,
            account: l.account,
            scope: l.scope,
            reason: l.reason,
            failures: l.failures,
            level: l.level,
            created_at: rfc3339(l.created_at_ms),
            locked_until: rfc3339(l.locked_until_ms),
            released_at: l.released_at_ms.map(rfc3339),
            released_by: l.released_by,
            release_reason: l.release_reason,
        }
    }
}

/// A page of lockouts, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LockoutPage {
    /// Lockouts.
    pub items: Vec<LockoutView>,
    /// Pass as `cursor` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/lockouts` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// `active` (default), `released`, `expired` or `all`.
    #[param(inline)]
    pub status: Option<Status>,
    /// Only this account.
    pub account: Option<String>,
    /// Only lockouts created at or after this RFC 3339 time.
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$")]
    pub cursor: Option<String>,
    /// Page size 1–500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// Lists lockouts, newest first (role `analyst`).
#[utoipa::path(get, path = "/v1/lockouts", tag = "lockouts", security(("bearer" = [])), params(ListParams),
    responses((status = 200, body = LockoutPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn list_lockouts(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<LockoutPage>, ApiError> {
    let limit = parse_limit(params.limit, 100, 500)?;
    let before = parse_cursor(params.cursor.as_deref())?;
    let since_ms = parse_since(params.since.as_deref())?;
    // The canonical id: a search for `Alice@Example.com` finds `alice@example.com`.
    let account = params
        .account
        .as_deref()
        .map(|a| {
            app.settings
                .http
                .identifiers()
                .account("account", a)
                .map(std::borrow::Cow::into_owned)
        })
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let (items, next_cursor) = app
        .lockouts
        .list(&Query {
            status: params.status.unwrap_or(Status::Active),
            account,
            since_ms,
            before,
            limit,
        })
        .await?;
    Ok(Json(LockoutPage {
        items: items.into_iter().map(LockoutView::from).collect(),
        next_cursor,
    }))
}

/// An event that caused a lockout.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventView {
    /// The auth service's id.
    pub event_id: String,
    /// `login_failure` or `login_success`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Account (canonical id, as every search and lockout names it).
    pub account: String,
    /// The account as the auth service spelled it, when that differs from `account`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_received: Option<String>,
    /// IP.
    pub ip: String,
    /// Device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// RFC 3339.
    pub ts: String,
}

/// One lockout with its events.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LockoutDetail {
    /// The lockout.
    #[serde(flatten)]
    pub lockout: LockoutView,
    /// The failure events that caused it (those still retained).
    pub events: Vec<EventView>,
}

fn lockout_id(id: &str) -> Result<(), ApiError> {
    ulid::Ulid::from_string(id)
        .map(|_| ())
        .map_err(|_| ApiError::not_found(format!("no lockout with id {id:.40?}")))
}

/// One lockout with the failure events that caused it (role `analyst`).
#[utoipa::path(get, path = "/v1/lockouts/{id}", tag = "lockouts", security(("bearer" = [])),
    params(("id" = String, Path, description = "lockout id")),
    responses((status = 200, body = LockoutDetail), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn get_lockout(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<LockoutDetail>, ApiError> {
    lockout_id(&id)?;
    let (lockout, events) = app.lockouts.get(&id).await?;
    Ok(Json(LockoutDetail {
        lockout: lockout.into(),
        events: events
            .into_iter()
            .map(|e: LockoutEvent| EventView {
                event_id: e.event_id,
                kind: e.kind,
                account: e.account,
                account_received: e.account_received,
                ip: e.ip,
                device_id: e.device_id,
                endpoint: e.endpoint,
                ts: rfc3339(e.ts_ms),
            })
            .collect(),
    }))
}

/// `POST /v1/lockouts/{id}/release` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// Why (1–500 characters; kept in the lockout and the audit log).
    #[schema(pattern = "^[^\\u0000]{1,500}$")]
    pub reason: String,
}

/// Releases a lockout at once on every instance (role `analyst`); audited.
#[utoipa::path(post, path = "/v1/lockouts/{id}/release", tag = "lockouts", security(("bearer" = [])),
    params(("id" = String, Path, description = "lockout id")), request_body = Release,
    responses((status = 200, body = LockoutView), (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope), (status = 409, body = Envelope)))]
async fn release_lockout(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Release>,
) -> Result<Json<LockoutView>, ApiError> {
    lockout_id(&id)?;
    let reason = body.reason.trim();
    if reason.is_empty() || reason.chars().count() > 500 {
        return Err(ApiError::invalid("reason must be 1-500 characters"));
    }
    let lockout = app
        .lockouts
        .release(&id, reason, &auth.caller.actor(), &current_request_id())
        .await?;
    Ok(Json(lockout.into()))
}
