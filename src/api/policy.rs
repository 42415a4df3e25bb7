//! Policy what-if (role `admin`): the traffic record replayed through a candidate `[limits]`.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiJson, Authorized, role};
use super::lockouts::parse_time;
use crate::app::AppState;
use crate::policy::replay::{Replayer, Report};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(simulate))
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
}

/// Checks one simulation replays at most (longer windows: `palisade replay`).
const MAX_RECORDS: usize = 1_000_000;

/// Replays the recorded traffic of a window (at most one million checks) through the live
/// `[limits]` and a candidate's and reports the difference: per class, per deciding scope,
/// and the keys it changes most (role `admin`). Needs `[record]` on; an empty record gives
/// an empty report.
#[utoipa::path(post, path = "/v1/policy/simulate", tag = "admin", security(("bearer" = [])),
    request_body = Simulate,
    responses((status = 200, body = Object), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn simulate(
    _auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<Simulate>,
) -> Result<Json<Report>, ApiError> {
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
    let started = std::time::Instant::now();
    let mut report = Report::default();
    let mut replayer: Option<Replayer> = None;
    let mut after: Option<(i64, String)> = None;
    let mut seen = 0usize;
    while seen < MAX_RECORDS {
        let page = crate::policy::record::read(
            &app.stores.durable,
            from_ms,
            to_ms,
            after.as_ref(),
            20_000,
        )
        .await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some((last.at_ms, last.id.clone()));
        let replayer = replayer.get_or_insert_with(|| {
            Replayer::new(&app.settings.limits, &candidate.limits, page[0].at_ms)
        });
        for record in page.iter().take(MAX_RECORDS - seen) {
            report.add(&replayer.step(record).await);
        }
        seen += page.len();
    }
    report.finish(10, started.elapsed());
    Ok(Json(report))
}
