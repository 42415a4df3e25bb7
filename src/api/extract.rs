//! Extractors: JSON, query and path wrappers whose rejections are envelopes, and the
//! role-checking [`Authorized`] extractor.

use std::marker::PhantomData;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};

use super::error::{ApiError, ErrorCode};
use crate::access::{Caller, Role};
use crate::app::AppState;

/// `axum::Json` whose rejection is a 400 (or 413) envelope, never axum's plain text.
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `axum::extract::Query` with envelope rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path` with envelope rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::MissingJsonContentType(_) => {
                ApiError::invalid("expected a JSON body with Content-Type: application/json")
            }
            JsonRejection::BytesRejection(ref inner)
                if inner.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    "request body is larger than the limit",
                )
            }
            other => ApiError::invalid(format!("invalid JSON body: {}", other.body_text())),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::invalid(format!("invalid query string: {}", rejection.body_text()))
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::invalid(format!("invalid path parameter: {}", rejection.body_text()))
    }
}

/// A role a route requires; implemented by the marker types in [`role`].
pub trait RequiredRole: Send + Sync + 'static {
    /// The role (an `admin` token passes every check).
    const ROLE: Role;
}

/// Marker types naming the role a route requires: `Authorized<role::Analyst>`.
pub mod role {
    use super::{RequiredRole, Role};

    /// Role `ingest`: the auth service.
    #[derive(Debug)]
    pub struct Ingest;
    /// Role `limiter`: gateways.
    #[derive(Debug)]
    pub struct Limiter;
    /// Role `analyst`: security analysts.
    #[derive(Debug)]
    pub struct Analyst;
    /// Role `admin`: operators.
    #[derive(Debug)]
    pub struct Admin;

    impl RequiredRole for Ingest {
        const ROLE: Role = Role::Ingest;
    }
    impl RequiredRole for Limiter {
        const ROLE: Role = Role::Limiter;
    }
    impl RequiredRole for Analyst {
        const ROLE: Role = Role::Analyst;
    }
    impl RequiredRole for Admin {
        const ROLE: Role = Role::Admin;
    }
}

/// The authenticated caller of a `/v1` route, whose role allows `R`.
///
/// Put it first among a handler's extractors: a request without a valid token gets 401 and
/// one with the wrong role 403 before its body is looked at.
#[derive(Debug)]
pub struct Authorized<R: RequiredRole> {
    /// Who is calling.
    pub caller: Caller,
    _role: PhantomData<R>,
}

/// The bearer token of a request, if it has one.
pub fn bearer_token(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

impl<R: RequiredRole> FromRequestParts<AppState> for Authorized<R> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let Some(token) = bearer_token(parts) else {
            metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "missing").increment(1);
            return Err(ApiError::new(
                ErrorCode::Unauthenticated,
                "missing API token: send Authorization: Bearer <token>",
            ));
        };
        let caller = state.access.authenticate(token).await.inspect_err(|_| {
            metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "unknown").increment(1);
        })?;
        if !caller.role.allows(R::ROLE) {
            metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "forbidden").increment(1);
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "this route needs the {} role; the token {:?} has {}",
                    R::ROLE.as_str(),
                    caller.name,
                    caller.role.as_str()
                ),
            ));
        }
        metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "ok")
            .increment(1);
        Ok(Authorized {
            caller,
            _role: PhantomData,
        })
    }
}
