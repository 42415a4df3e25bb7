//! OTP delivery events (role `ingest`): what each destination's conversion is judged from.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope, ErrorCode};
use super::extract::{ApiJson, Authorized, role};
use crate::app::AppState;
use crate::messaging::DeliveryBatch;
use crate::messaging::events::MAX_BATCH;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(post_messaging_events))
}

/// One delivery event (documentation of `DeliveryBatch.events`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryEventDoc {
    /// Idempotency key, 1–128 printable characters: a retried event is stored and counted
    /// once.
    pub event_id: String,
    /// `otp_sent` (a code went out) or `otp_verified` (a code was entered correctly).
    #[serde(rename = "type")]
    #[schema(pattern = "^(otp_sent|otp_verified)$")]
    pub kind: String,
    /// The phone number, e-mail address or push token, in any spelling (as on the limit
    /// check).
    pub recipient: String,
    /// RFC 3339; absent = time of receipt; at most 24 h old or 5 min ahead.
    pub ts: Option<String>,
}

/// An accepted batch.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveriesAccepted {
    /// Events stored by this call (a retried one counts once).
    pub stored: u64,
    /// Destinations whose conversion collapsed with this batch: tightened on `messaging`
    /// (factor `messaging:otp_conversion`), one alert each per incident.
    pub tightened: Vec<String>,
}

/// Reports codes sent and verified (role `ingest`), for each destination's conversion.
///
/// Per destination (a phone number's country code and leading digits, or an e-mail domain),
/// codes verified per code sent are counted in windows of `messaging.conversion.window_s`;
/// a window whose rate collapses below half the destination's learned normal (or the floor,
/// before it is learned) tightens the destination's `messaging` budgets for
/// `messaging.conversion.hold_s` and raises an `otp_conversion` alert. A 2xx means every event
/// is durably stored; a bad event rejects the batch with `details.errors: [{index, reason}]`;
/// more than 1000 events is 413.
#[utoipa::path(post, path = "/v1/events/messaging", tag = "scoring", security(("bearer" = [])),
    request_body(content = inline(Vec<DeliveryEventDoc>), description = "`{events: [...]}`, 1–1000 events"),
    responses(
        (status = 200, body = DeliveriesAccepted),
        (status = 400, body = Envelope), (status = 401, body = Envelope), (status = 403, body = Envelope),
        (status = 413, body = Envelope), (status = 503, body = Envelope),
    ))]
async fn post_messaging_events(
    _auth: Authorized<role::Ingest>,
    State(app): State<AppState>,
    ApiJson(batch): ApiJson<DeliveryBatch>,
) -> Result<Json<DeliveriesAccepted>, ApiError> {
    if batch.events.is_empty() {
        return Err(ApiError::invalid("events must hold at least one event"));
    }
    if batch.events.len() > MAX_BATCH {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "at most {MAX_BATCH} events per batch; got {}",
                batch.events.len()
            ),
        ));
    }
    let now_ms = app.clock.now_ms();
    let ingested = app
        .messaging
        .ingest(&batch.events, now_ms)
        .await?
        .map_err(|errors| {
            ApiError::invalid(format!(
                "{} of {} events are invalid; nothing was stored",
                errors.len(),
                batch.events.len()
            ))
            .with_details(serde_json::json!({ "errors": errors }))
        })?;
    Ok(Json(DeliveriesAccepted {
        stored: ingested.stored,
        tightened: ingested.tightened,
    }))
}
