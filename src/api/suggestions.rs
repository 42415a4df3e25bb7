//! Budgets from real traffic: the suggestion computed from the traffic record and replayed
//! against the live policy.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiQuery, Authorized, role};
use super::lockouts::parse_time;
use crate::app::AppState;
use crate::policy::record::why_empty;
use crate::policy::suggest::{Options, Proposal, propose};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(suggestions))
}

/// `GET /v1/policy/suggestions` parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SuggestParams {
    /// From this RFC 3339 time (default: `record.retention_hours` before `to`).
    pub from: Option<String>,
    /// Before this RFC 3339 time (default: now).
    pub to: Option<String>,
    /// Percent of honest keys each budget keeps under it per period, above 0 and at most
    /// 100 (default 99.9).
    pub honest: Option<f64>,
    /// The honest quantile is multiplied by this, 1–10, before rounding to a readable number
    /// (default 1.25).
    pub headroom: Option<f64>,
}

/// Checks one suggestion's replays read at most (longer windows: `palisade policy suggest`).
const MAX_RECORDS: usize = 1_000_000;

/// Suggests budgets from the recorded traffic of a window: for every budget, the
/// distribution of checks per key and period over the clients the engine did not flag, the
/// live and suggested value, key-windows over each, and the flagged keys it would stop;
/// `suggestion.toml` is a candidate settings file holding the whole `[limits]`. The
/// suggestion is replayed against the live policy over the same window (`replay`) and, when
/// the record spans ten of the longest budget period, computed from the first three quarters
/// and replayed over the last (`holdout`). Role `admin`; needs `[record]` on, and an empty
/// window says why in `empty`.
#[utoipa::path(operation_id = "suggest_budgets", get, path = "/v1/policy/suggestions", tag = "admin", security(("bearer" = [])),
    params(SuggestParams),
    responses((status = 200, body = Object), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn suggestions(
    _auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<SuggestParams>,
) -> Result<Json<Proposal>, ApiError> {
    let defaults = Options::default();
    let options = Options {
        honest: params.honest.unwrap_or(defaults.honest),
        headroom: params.headroom.unwrap_or(defaults.headroom),
    };
    options.validate().map_err(ApiError::invalid)?;
    let now = app.clock.now_ms();
    let to_ms = parse_time("to", params.to.as_deref())?.unwrap_or(now + 1);
    let retention_ms = i64::try_from(app.settings.record.retention_hours)
        .unwrap_or(i64::MAX)
        .saturating_mul(3_600_000);
    let from_ms =
        parse_time("from", params.from.as_deref())?.unwrap_or(to_ms.saturating_sub(retention_ms));
    if from_ms >= to_ms {
        return Err(ApiError::invalid("from must be before to"));
    }
    let live = app.canary.live_limits();
    let mut proposal = propose(
        &app.stores.durable,
        (&app.settings, &live),
        (from_ms, to_ms),
        options,
        MAX_RECORDS,
    )
    .await?;
    if proposal.suggestion.records == 0 {
        proposal.empty = Some(why_empty(&app.settings.record, from_ms, now));
    }
    Ok(Json(proposal))
}
