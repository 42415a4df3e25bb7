//! What the limiter decided (role `analyst`): decisions per class over the last hour or day,
//! and the history of refused and challenged checks.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiQuery, Authorized, parse_limit, role};
use super::lockouts::parse_time;
use crate::app::AppState;
use crate::clock::rfc3339;
use crate::model::ClientIp;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(decision_rates))
        .routes(routes!(history))
}

/// `GET /v1/stats/decisions` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RatesParams {
    /// `hour` (60 points of one minute, default) or `day` (96 points of 15 minutes).
    #[param(pattern = "^(hour|day)$")]
    pub window: Option<String>,
}

/// One point of a class's series.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RatePoint {
    /// RFC 3339 of the point's start.
    pub at: String,
    /// Requests allowed.
    pub allowed: u64,
    /// Requests refused.
    pub limited: u64,
}

/// One class's decisions over the window.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ClassRates {
    /// The endpoint class.
    pub class: String,
    /// Requests allowed in the window.
    pub allowed: u64,
    /// Requests refused in the window.
    pub limited: u64,
    /// `limited / (allowed + limited)`, 0 without requests.
    pub block_rate: f64,
    /// Oldest first.
    pub points: Vec<RatePoint>,
}

/// Decisions per class over the last hour or day.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DecisionRates {
    /// `hour` or `day`.
    pub window: String,
    /// Seconds per point.
    pub step_s: u32,
    /// Per class, in the order of the configuration.
    pub classes: Vec<ClassRates>,
}

/// Limit decisions per endpoint class over the last hour or day, as this instance made them
/// (each instance counts its own; sum them across instances, or use the Prometheus counter
/// `palisade_limit_decisions_total` for the fleet) (role `analyst`).
#[utoipa::path(get, path = "/v1/stats/decisions", tag = "analyst", security(("bearer" = [])),
    params(RatesParams),
    responses((status = 200, body = DecisionRates), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn decision_rates(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<RatesParams>,
) -> Result<Json<DecisionRates>, ApiError> {
    let (window, minutes, step) = match params.window.as_deref() {
        None | Some("hour") => ("hour", 60, 1),
        Some("day") => ("day", 1440, 15),
        Some(_) => return Err(ApiError::invalid("window must be hour or day")),
    };
    let rates = app.limiter.rates();
    let now = app.clock.now_ms();
    let classes = rates
        .classes()
        .filter_map(|class| {
            let series = rates.series(class, now, minutes)?;
            let points: Vec<RatePoint> = series
                .chunks(step)
                .map(|chunk| RatePoint {
                    at: rfc3339(chunk[0].at_ms),
                    allowed: chunk.iter().map(|m| m.allowed).sum(),
                    limited: chunk.iter().map(|m| m.limited).sum(),
                })
                .collect();
            let allowed: u64 = points.iter().map(|p| p.allowed).sum();
            let limited: u64 = points.iter().map(|p| p.limited).sum();
            let total = allowed + limited;
            Some(ClassRates {
                class: class.to_owned(),
                allowed,
                limited,
                block_rate: if total == 0 {
                    0.0
                } else {
                    limited as f64 / total as f64
                },
                points,
            })
        })
        .collect();
    Ok(Json(DecisionRates {
        window: window.to_owned(),
        step_s: u32::try_from(step * 60).unwrap_or(u32::MAX),
        classes,
    }))
}

/// `GET /v1/history` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// Only decisions about this account (matched by its canonical id).
    pub account: Option<String>,
    /// Only decisions about this client address.
    #[param(schema_with = super::schema::ip)]
    pub ip: Option<String>,
    /// Only decisions about this device.
    pub device_id: Option<String>,
    /// Only entries whose last decision is at or after this RFC 3339 time.
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Only entries whose first decision is before this RFC 3339 time.
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$")]
    pub cursor: Option<String>,
    /// Page size 1–500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// One entry of the decision history: one key's refusals (or challenges) by one budget
/// within `history.window_s`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HistoryView {
    /// ULID.
    pub id: String,
    /// RFC 3339 of the first decision counted.
    pub first_at: String,
    /// RFC 3339 of the last.
    pub last_at: String,
    /// Decisions counted.
    pub count: u64,
    /// Endpoint class.
    pub class: String,
    /// `limited` (429) or `challenge` (allowed with a step-up).
    pub outcome: String,
    /// The reason code a client saw (`account_locked`, `ip_rate`, …) or the challenge's.
    pub reason: String,
    /// The user key of the request (`user:…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_key: Option<String>,
    /// The client address.
    pub ip: String,
    /// The device key of the request (`device:…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_key: Option<String>,
    /// Why: `deciding` (index into `scopes`), every scope's bucket (`budget`, `scope`, `key`,
    /// `limit`, `remaining`, `retry_after_ms`, `multiplier`, `allowed`, `enforced`), and per
    /// key its multiplier with the factors behind it (`keys`), read when the entry was written.
    #[schema(value_type = Object)]
    pub explanation: serde_json::Value,
}

/// A page of the decision history, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HistoryPage {
    /// Entries.
    pub items: Vec<HistoryView>,
    /// Pass as `cursor` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

impl From<crate::analyst::history::Entry> for HistoryView {
    fn from(e: crate::analyst::history::Entry) -> Self {
        HistoryView {
            id: e.id,
            first_at: rfc3339(e.first_ms),
            last_at: rfc3339(e.last_ms),
            count: e.count,
            class: e.class,
            outcome: e.outcome,
            reason: e.reason,
            user_key: e.user_key,
            ip: e.ip,
            device_key: e.device_key,
            explanation: e.explanation,
        }
    }
}

/// Refused and challenged limit checks with their explanation, newest first, kept for
/// `history.retention_days` (role `analyst`): "why was this user refused at 14:02?".
#[utoipa::path(operation_id = "decision_history", get, path = "/v1/history", tag = "analyst", security(("bearer" = [])),
    params(HistoryParams),
    responses((status = 200, body = HistoryPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn history(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<HistoryParams>,
) -> Result<Json<HistoryPage>, ApiError> {
    let limit = parse_limit(params.limit, 100, 500)?;
    let before = super::extract::parse_cursor(params.cursor.as_deref())?;
    let ids = app.settings.http.identifiers();
    let invalid = |e: crate::model::InvalidId| ApiError::invalid(e.to_string());
    let user_key = params
        .account
        .as_deref()
        .map(|a| ids.user_key("account", a).map(|k| k.to_string()))
        .transpose()
        .map_err(invalid)?;
    let device_key = params
        .device_id
        .as_deref()
        .map(|d| ids.device_key(d).map(|k| k.to_string()))
        .transpose()
        .map_err(invalid)?;
    let ip = params
        .ip
        .as_deref()
        .map(|ip| {
            ClientIp::parse(ip, 128)
                .map(|ip| ip.addr().to_string())
                .ok_or_else(|| ApiError::invalid(format!("ip {ip:.64?} is not an IP address")))
        })
        .transpose()?;
    let (items, next_cursor) = app
        .history
        .list(&crate::analyst::history::Query {
            user_key,
            ip,
            device_key,
            since_ms: parse_time("since", params.since.as_deref())?,
            until_ms: parse_time("until", params.until.as_deref())?,
            before,
            limit,
        })
        .await?;
    Ok(Json(HistoryPage {
        items: items.into_iter().map(HistoryView::from).collect(),
        next_cursor,
    }))
}
