//! Device attestation (role `ingest`: the auth service relays the app's tokens; the latest
//! verdict is for analysts).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiJson, ApiPath, Authorized, role};
use crate::app::AppState;
use crate::attestation::{Level, Rejection, Submission, Verdict};
use crate::clock::rfc3339;
use crate::model::encoding::decode_base64;
use crate::model::{Reason, SubjectKey};

/// Largest token or CBOR object accepted (base64 text), bytes.
const MAX_BLOB: usize = 64 * 1024;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(challenge))
        .routes(routes!(submit))
        .routes(routes!(current))
}

/// `POST /v1/attestations/challenge` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChallengeRequest {
    /// The device that will attest.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    pub device_id: String,
}

/// An issued challenge.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChallengeView {
    /// Base64url, single use. Play Integrity: the request's `nonce` (or `requestHash`).
    /// App Attest: its UTF-8 bytes are the client data (SHA-256 = `clientDataHash`).
    pub challenge: String,
    /// RFC 3339.
    pub expires_at: String,
}

fn device(app: &AppState, id: &str) -> Result<SubjectKey, ApiError> {
    app.settings
        .http
        .identifiers()
        .device_key(id)
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// Issues a single-use attestation challenge for a device (role `ingest`), valid for
/// `attestation.challenge_ttl_s` (default 5 min).
#[utoipa::path(operation_id = "attestation_challenge", post, path = "/v1/attestations/challenge", tag = "attestation", security(("bearer" = [])),
    request_body = ChallengeRequest,
    responses((status = 201, body = ChallengeView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn challenge(
    _auth: Authorized<role::Ingest>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<ChallengeRequest>,
) -> Result<(StatusCode, Json<ChallengeView>), ApiError> {
    let key = device(&app, &body.device_id)?;
    let (challenge, expires) = app.attestation.challenge(&key).await?;
    Ok((
        StatusCode::CREATED,
        Json(ChallengeView {
            challenge,
            expires_at: rfc3339(expires),
        }),
    ))
}

/// Play Integrity input: the raw token, or the verdict the caller decoded.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlayIntegrityInput {
    /// The integrity token (JWE compact), decrypted and verified by Palisade.
    #[serde(default)]
    pub token: Option<String>,
    /// The payload Google's `decodeIntegrityToken` returned.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub verdict: Option<serde_json::Value>,
}

/// App Attest input: an attestation object (new key) or an assertion (attested key).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppAttestInput {
    /// The key id (base64), SHA-256 of the key's public key.
    pub key_id: String,
    /// The attestation object (base64 CBOR) from `attestKey`.
    #[serde(default)]
    pub attestation_object: Option<String>,
    /// The assertion (base64 CBOR) from `generateAssertion`.
    #[serde(default)]
    pub assertion: Option<String>,
}

/// `POST /v1/attestations` body: exactly one of `play_integrity` and `app_attest`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttestationRequest {
    /// The device.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    pub device_id: String,
    /// The challenge issued for it (consumed: single use).
    pub challenge: String,
    /// Android.
    #[serde(default)]
    pub play_integrity: Option<PlayIntegrityInput>,
    /// iOS.
    #[serde(default)]
    pub app_attest: Option<AppAttestInput>,
}

/// A stored verdict.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct VerdictView {
    /// Verdict id (ULID).
    pub id: String,
    /// The device.
    pub device_id: String,
    /// `play_integrity` or `app_attest`.
    pub platform: String,
    /// `strong`, `device`, `basic`, `failed` (or `unverified` once expired).
    pub level: Level,
    /// RFC 3339; afterwards the device is unverified.
    pub expires_at: String,
    /// RFC 3339.
    pub verified_at: String,
    /// Why.
    pub reasons: Vec<Reason>,
}

impl VerdictView {
    fn new(verdict: Verdict, now_ms: i64) -> Self {
        let expired = verdict.expires_at_ms <= now_ms;
        VerdictView {
            id: verdict.id,
            device_id: verdict.device_id,
            platform: verdict.platform,
            level: if expired {
                Level::Unverified
            } else {
                verdict.level
            },
            expires_at: rfc3339(verdict.expires_at_ms),
            verified_at: rfc3339(verdict.verified_at_ms),
            reasons: verdict.reasons,
        }
    }
}

fn blob(text: &str, what: &str) -> Result<Vec<u8>, ApiError> {
    if text.len() > MAX_BLOB {
        return Err(ApiError::invalid(format!(
            "{what} is larger than {MAX_BLOB} bytes"
        )));
    }
    decode_base64(text).ok_or_else(|| {
        ApiError::invalid(format!("{what} is not base64"))
            .with_details(serde_json::json!({"reason": "malformed"}))
    })
}

fn submission(body: &mut AttestationRequest) -> Result<Submission, ApiError> {
    match (body.play_integrity.take(), body.app_attest.take()) {
        (Some(play), None) => match (play.token, play.verdict) {
            (Some(token), None) if token.len() <= MAX_BLOB => {
                Ok(Submission::PlayIntegrityToken(token))
            }
            (Some(_), None) => Err(ApiError::invalid(format!(
                "token is larger than {MAX_BLOB} bytes"
            ))),
            (None, Some(verdict)) => Ok(Submission::PlayIntegrityVerdict(verdict)),
            _ => Err(ApiError::invalid(
                "play_integrity needs exactly one of token and verdict",
            )),
        },
        (None, Some(apple)) => {
            let key_id = blob(&apple.key_id, "key_id")?;
            match (apple.attestation_object, apple.assertion) {
                (Some(object), None) => Ok(Submission::AppAttestAttestation {
                    object: blob(&object, "attestation_object")?,
                    key_id,
                }),
                (None, Some(assertion)) => Ok(Submission::AppAttestAssertion {
                    assertion: blob(&assertion, "assertion")?,
                    key_id,
                }),
                _ => Err(ApiError::invalid(
                    "app_attest needs exactly one of attestation_object and assertion",
                )),
            }
        }
        _ => Err(ApiError::invalid(
            "give exactly one of play_integrity and app_attest",
        )),
    }
}

/// Verifies a device's attestation against the challenge issued for it and stores the
/// verdict (role `ingest`). Play Integrity tokens are decrypted and verified locally (JWE
/// A256KW + A256GCM, JWS ES256); App Attest objects are verified against Apple's root. A
/// failed check is 400 with `details.reason` (`challenge_replayed`, `nonce_mismatch`,
/// `signature_invalid`, …) and stores nothing. The level feeds the device's multiplier.
#[utoipa::path(operation_id = "submit_attestation", post, path = "/v1/attestations", tag = "attestation", security(("bearer" = [])),
    request_body = AttestationRequest,
    responses((status = 200, body = VerdictView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn submit(
    _auth: Authorized<role::Ingest>,
    State(app): State<AppState>,
    ApiJson(mut body): ApiJson<AttestationRequest>,
) -> Result<Json<VerdictView>, ApiError> {
    let key = device(&app, &body.device_id)?;
    let submission = submission(&mut body)?;
    let verdict = app
        .attestation
        .submit(&key, &body.device_id, &body.challenge, submission)
        .await?;
    Ok(Json(VerdictView::new(verdict, app.clock.now_ms())))
}

/// A device's latest verdict (role `analyst`); 404 when it never attested.
#[utoipa::path(operation_id = "attestation_verdict", get, path = "/v1/attestations/{device_id}", tag = "attestation", security(("bearer" = [])),
    params(("device_id" = String, Path, description = "the device", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")),
    responses((status = 200, body = VerdictView), (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope), (status = 503, body = Envelope)))]
async fn current(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(device_id): ApiPath<String>,
) -> Result<Json<VerdictView>, ApiError> {
    device(&app, &device_id)?;
    let verdict =
        app.attestation.current(&device_id).await?.ok_or_else(|| {
            ApiError::not_found(format!("device {device_id:.64?} never attested"))
        })?;
    Ok(Json(VerdictView::new(verdict, app.clock.now_ms())))
}

impl From<crate::attestation::Error> for ApiError {
    fn from(err: crate::attestation::Error) -> Self {
        match err {
            crate::attestation::Error::Rejected(rejection) => rejected(&rejection),
            crate::attestation::Error::Store(store) => store.into(),
        }
    }
}

fn rejected(rejection: &Rejection) -> ApiError {
    ApiError::invalid(format!("attestation rejected: {rejection}"))
        .with_details(serde_json::json!({ "reason": rejection.code() }))
}
