//! The one error type of the HTTP edge and the contract's error envelope.
//!
//! Every error response has the body
//! `{"error":{"code","message","details","request_id"}}` and an `X-Request-Id` header.
//! [`ApiError`] renders itself; [`envelope_for_status`] wraps errors produced outside the
//! handlers (axum's 404/405, body limits, timeouts, panics) the same way.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::request_id::current_request_id;

/// The error codes of DESIGN.md, plus `INTERNAL` for a genuine bug (never caused by input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// 400: the input is malformed or out of range.
    InvalidArgument,
    /// 401: no token, or an unknown/revoked one.
    Unauthenticated,
    /// 403: the token's role may not call this route.
    Forbidden,
    /// 404: no such route or resource.
    NotFound,
    /// 409: the request conflicts with the current state.
    Conflict,
    /// 413: the body is larger than `http.body_limit_bytes`, or a batch is too long.
    PayloadTooLarge,
    /// 429: a budget is exhausted.
    RateLimited,
    /// 503: a store is unreachable or the request timed out.
    Unavailable,
    /// 500: a bug in Palisade (documented deviation: not in DESIGN.md's list, because no
    /// input may cause it).
    Internal,
}

impl ErrorCode {
    /// The HTTP status of this code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The code as it appears in the envelope.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Conflict => "CONFLICT",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Internal => "INTERNAL",
        }
    }
}

/// The error envelope (for the OpenAPI document and clients).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Envelope {
    /// The error.
    pub error: EnvelopeBody,
}

/// The inside of the error envelope.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EnvelopeBody {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
    /// Code-specific facts, e.g. `retry_after_ms` for `RATE_LIMITED`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub details: Option<serde_json::Value>,
    /// The request id, also sent as `X-Request-Id`.
    pub request_id: String,
}

/// Marks a response whose body is already an envelope.
#[derive(Debug, Clone, Copy)]
pub(super) struct EnvelopeRendered;

/// The only error a handler returns (boxed: it travels in every handler's `Result`).
#[derive(Debug)]
pub struct ApiError(Box<Inner>);

#[derive(Debug)]
struct Inner {
    code: ErrorCode,
    status: StatusCode,
    message: String,
    details: Option<serde_json::Value>,
    headers: HeaderMap,
    /// Logged, never sent.
    cause: Option<String>,
}

impl ApiError {
    /// An error with a code and a message for the client.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self(Box::new(Inner {
            code,
            status: code.status(),
            message: message.into(),
            details: None,
            headers: HeaderMap::new(),
            cause: None,
        }))
    }

    /// 400 `INVALID_ARGUMENT`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// 404 `NOT_FOUND`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    /// 503 `UNAVAILABLE`, with the internal cause kept for the log.
    pub fn unavailable(message: impl Into<String>, cause: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::Unavailable, message).with_cause(cause)
    }

    /// 500 `INTERNAL`: a bug. The cause is logged with the request id, not sent.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        Self::new(
            ErrorCode::Internal,
            "internal error; see the server log for this request id",
        )
        .with_cause(cause)
    }

    /// Adds code-specific details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.0.details = Some(details);
        self
    }

    /// Adds a response header (`Retry-After`, `X-RateLimit-*`, `Allow`).
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.0.headers.insert(name, value);
        self
    }

    /// Keeps an internal cause for the log.
    pub fn with_cause(mut self, cause: impl std::fmt::Display) -> Self {
        self.0.cause = Some(cause.to_string());
        self
    }

    /// Overrides the HTTP status while keeping the code (used for 405).
    pub(super) fn with_status(mut self, status: StatusCode) -> Self {
        self.0.status = status;
        self
    }

    /// The code.
    pub fn code(&self) -> ErrorCode {
        self.0.code
    }

    /// The message for the client.
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0.code.as_str(), self.0.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let this = *self.0;
        let request_id = current_request_id();
        match (&this.cause, this.code) {
            (Some(cause), ErrorCode::Internal) => {
                tracing::error!(error.cause = %cause, "request failed: {}", this.message);
            }
            (Some(cause), _) => {
                tracing::warn!(error.cause = %cause, "request failed: {}", this.message)
            }
            (None, _) => tracing::debug!("request rejected: {}", this.message),
        }
        let body = Envelope {
            error: EnvelopeBody {
                code: this.code,
                message: this.message,
                details: this.details,
                request_id,
            },
        };
        let json = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = (this.status, json).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.extend(this.headers);
        response.extensions_mut().insert(EnvelopeRendered);
        response
    }
}

/// The envelope for an error response that did not come from an [`ApiError`].
///
/// Keeps the original headers (e.g. `Allow` on 405) and maps statuses outside the contract
/// to its codes: 405 keeps its status with `INVALID_ARGUMENT`, 408/504 become 503, 415 and
/// 422 become 400.
pub(super) fn envelope_for_status(
    status: StatusCode,
    original: &HeaderMap,
    method: &str,
    path: &str,
) -> Response {
    let error = match status {
        StatusCode::NOT_FOUND => ApiError::not_found(format!("no route for {method} {path}")),
        StatusCode::METHOD_NOT_ALLOWED => {
            ApiError::invalid(format!("method {method} is not allowed on {path}"))
                .with_status(status)
        }
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            ErrorCode::PayloadTooLarge,
            "request body is larger than the limit",
        ),
        StatusCode::UNAUTHORIZED => {
            ApiError::new(ErrorCode::Unauthenticated, "authentication required")
        }
        StatusCode::FORBIDDEN => ApiError::new(ErrorCode::Forbidden, "forbidden"),
        StatusCode::CONFLICT => ApiError::new(ErrorCode::Conflict, "conflict"),
        StatusCode::TOO_MANY_REQUESTS => ApiError::new(ErrorCode::RateLimited, "too many requests"),
        StatusCode::REQUEST_TIMEOUT
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => ApiError::new(
            ErrorCode::Unavailable,
            "the request timed out or a store is unavailable",
        ),
        s if s.is_client_error() => ApiError::invalid(format!("request rejected ({s})")),
        s => ApiError::internal(format!("unexpected {s} response without an envelope")),
    };
    let mut response = error.into_response();
    for (name, value) in original {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    response
}

impl From<crate::store::Error> for ApiError {
    fn from(err: crate::store::Error) -> Self {
        if err.is_unavailable() {
            ApiError::unavailable("a store is unavailable; retry later", err)
        } else {
            ApiError::internal(err)
        }
    }
}

impl From<crate::access::Error> for ApiError {
    fn from(err: crate::access::Error) -> Self {
        use crate::access::Error as E;
        match err {
            E::UnknownToken | E::BootstrapRetired | E::BootstrapExpired => {
                ApiError::new(ErrorCode::Unauthenticated, err.to_string())
            }
            E::NameTaken(_) | E::BootstrapNotRevocable => {
                ApiError::new(ErrorCode::Conflict, err.to_string())
            }
            E::InvalidName => ApiError::invalid(err.to_string()),
            E::NotFound(_) => ApiError::not_found(err.to_string()),
            E::Store(store) => store.into(),
        }
    }
}

impl From<crate::lockout::Error> for ApiError {
    fn from(err: crate::lockout::Error) -> Self {
        use crate::lockout::Error as E;
        match err {
            E::NotFound(_) => ApiError::not_found(err.to_string()),
            E::AlreadyReleased(_) => ApiError::new(ErrorCode::Conflict, err.to_string()),
            E::TooBroad(_) => ApiError::invalid(err.to_string()),
            E::NotActive(_) => ApiError::new(ErrorCode::Conflict, err.to_string()),
            E::Store(store) => store.into(),
        }
    }
}

impl From<crate::ingest::Error> for ApiError {
    fn from(err: crate::ingest::Error) -> Self {
        match err {
            crate::ingest::Error::Store(store) => store.into(),
            crate::ingest::Error::Lockout(lockout) => lockout.into(),
            crate::ingest::Error::Scoring(scoring) => scoring.into(),
            crate::ingest::Error::Conflict(errors) => ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "{} events reuse an event_id stored before with other content; nothing was stored",
                    errors.len()
                ),
            )
            .with_details(serde_json::json!({ "errors": errors })),
            crate::ingest::Error::Challenges(errors) => ApiError::invalid(format!(
                "{} challenge_passed events name no challenge issued for their account; nothing was stored",
                errors.len()
            ))
            .with_details(serde_json::json!({ "errors": errors })),
        }
    }
}

impl From<crate::scoring::Error> for ApiError {
    fn from(err: crate::scoring::Error) -> Self {
        match err {
            crate::scoring::Error::Store(store) => store.into(),
        }
    }
}
