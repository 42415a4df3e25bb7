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

/// A JSON body whose rejection is a 400 (or 413) envelope, never axum's plain text.
///
/// NUL characters (raw or `\u0000`) are refused: they mean nothing in Palisade's input, and
/// Postgres cannot store them in text (it would be a database error, not a 400).
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(
        request: axum::extract::Request,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let JsonBody(bytes) = JsonBody::from_request(request, state).await?;
        // serde_json alone for a body that parses; axum's parser (which tracks the path to
        // report where a body went wrong, at a cost on every field) only to word the error.
        if let Ok(value) = serde_json::from_slice::<T>(&bytes) {
            return Ok(ApiJson(value));
        }
        let axum::Json(value) = axum::Json::<T>::from_bytes(&bytes)?;
        Ok(ApiJson(value))
    }
}

/// The bytes of a JSON body, checked as [`ApiJson`] checks them (type, size, no NUL), for a
/// handler that parses them itself.
#[derive(Debug)]
pub struct JsonBody(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(
        request: axum::extract::Request,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let json_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| {
                let mime = mime.trim().as_bytes();
                let ends_with = |suffix: &[u8]| {
                    mime.len() >= suffix.len()
                        && mime[mime.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                };
                mime.eq_ignore_ascii_case(b"application/json")
                    || (mime.len() >= 12
                        && mime[..12].eq_ignore_ascii_case(b"application/")
                        && ends_with(b"+json"))
            });
        if !json_type {
            return Err(ApiError::invalid(
                "expected a JSON body with Content-Type: application/json",
            ));
        }
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        ErrorCode::PayloadTooLarge,
                        "request body is larger than the limit",
                    )
                } else {
                    ApiError::invalid(format!("cannot read the body: {}", rejection.body_text()))
                }
            })?;
        // JSON writes the escape `\u` in lower case only (serde refuses `\U`).
        // The escape's finder is built once (building one per body cost more than the search).
        static ESCAPED_NUL: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\\u0000"));
        if memchr::memchr(0, &bytes).is_some() || ESCAPED_NUL.find(&bytes).is_some() {
            return Err(ApiError::invalid("NUL characters are not accepted"));
        }
        Ok(JsonBody(bytes))
    }
}

/// `axum::extract::Query` with envelope rejections (and no NUL characters, see [`ApiJson`]).
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        refuse_nul(parts.uri.query().unwrap_or(""))?;
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(ApiQuery(value))
    }
}

/// `axum::extract::Path` with envelope rejections (and no NUL characters, see [`ApiJson`]).
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        refuse_nul(parts.uri.path())?;
        let axum::extract::Path(value) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(ApiPath(value))
    }
}

fn refuse_nul(text: &str) -> Result<(), ApiError> {
    if text.to_ascii_lowercase().contains("%00") {
        return Err(ApiError::invalid("NUL characters are not accepted"));
    }
    Ok(())
}

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
    /// A second role that may call the route too.
    const ALSO: Option<Role> = None;
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
    /// Role `limiter` or `analyst`: read-only views both need (multipliers, reputation).
    #[derive(Debug)]
    pub struct Reader;

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
    impl RequiredRole for Reader {
        const ROLE: Role = Role::Limiter;
        const ALSO: Option<Role> = Some(Role::Analyst);
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
        let caller = authorize_either(state, bearer_token(parts), R::ROLE, R::ALSO).await?;
        Ok(Authorized {
            caller,
            _role: PhantomData,
        })
    }
}

/// Checks a presented token (however the route receives it) against a role: 401 when it is
/// missing or unknown, 403 when its role does not allow `role`. Counted in metrics.
pub async fn authorize(
    state: &AppState,
    token: Option<&str>,
    role: Role,
) -> Result<Caller, ApiError> {
    authorize_either(state, token, role, None).await
}

/// [`authorize`] for a route that a second role may call too.
async fn authorize_either(
    state: &AppState,
    token: Option<&str>,
    role: Role,
    also: Option<Role>,
) -> Result<Caller, ApiError> {
    let Some(token) = token else {
        metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "missing")
            .increment(1);
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "missing API token: send Authorization: Bearer <token>",
        ));
    };
    let caller = state.access.authenticate(token).await.inspect_err(|_| {
        metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "unknown").increment(1);
    })?;
    if !caller.role.allows(role) && !also.is_some_and(|also| caller.role.allows(also)) {
        metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "forbidden")
            .increment(1);
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "this route needs the {} role; the token {:?} has {}",
                match also {
                    Some(also) => format!("{} or {}", role.as_str(), also.as_str()),
                    None => role.as_str().to_owned(),
                },
                caller.name,
                caller.role.as_str()
            ),
        ));
    }
    // The handle of the one hot counter is looked up once, not per request (registered
    // after the recorder: requests only come once an `App` has installed it).
    static OK: std::sync::OnceLock<metrics::Counter> = std::sync::OnceLock::new();
    OK.get_or_init(
        || metrics::counter!(crate::telemetry::metrics::ACCESS_CHECKS_TOTAL, "outcome" => "ok"),
    )
    .increment(1);
    Ok(caller)
}

/// A page cursor returned by a listing of this API (a ULID).
pub(super) fn parse_cursor(cursor: Option<&str>) -> Result<Option<ulid::Ulid>, ApiError> {
    cursor
        .map(|c| {
            ulid::Ulid::from_string(c)
                .map_err(|_| ApiError::invalid("cursor is not a cursor returned by this API"))
        })
        .transpose()
}

/// A `since` filter: RFC 3339 → Unix ms.
pub(super) fn parse_since(since: Option<&str>) -> Result<Option<i64>, ApiError> {
    since
        .map(|s| {
            chrono::DateTime::parse_from_rfc3339(s)
                .map(|t| t.timestamp_millis())
                .map_err(|_| ApiError::invalid("since must be an RFC 3339 time"))
        })
        .transpose()
}

/// `?reason=` of a destructive action (revoking a token, deleting a list entry): required,
/// and kept in the audit log.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReasonQuery {
    /// Why, 1–500 characters (kept in the audit log).
    #[param(min_length = 1, max_length = 500)]
    pub reason: Option<String>,
}

/// A reason for an audited action: 1–500 characters, no control or invisible characters
/// ([`crate::model::free_text`]).
pub(super) fn parse_reason(reason: Option<&str>) -> Result<String, ApiError> {
    match crate::model::free_text(reason.unwrap_or(""), 500) {
        Ok(reason) => Ok(reason.to_owned()),
        Err(crate::model::IdProblem::Length(_)) => Err(ApiError::invalid(
            "reason is required: 1-500 characters saying why (kept in the audit log)",
        )),
        Err(problem) => Err(ApiError::invalid(format!("reason {problem}"))),
    }
}

/// The one subject named by `account`, `ip` or `device_id` (a body naming none or several
/// is refused): its subject key as the limiter keys it.
pub(super) fn one_subject(
    app: &AppState,
    account: Option<&str>,
    ip: Option<&str>,
    device_id: Option<&str>,
) -> Result<crate::model::SubjectKey, ApiError> {
    let ids = app.settings.http.identifiers();
    let invalid = |e: crate::model::InvalidId| ApiError::invalid(e.to_string());
    match (account, ip, device_id) {
        (Some(account), None, None) => ids.user_key("account", account).map_err(invalid),
        (None, Some(ip), None) => {
            let ip = crate::model::ClientIp::parse(ip, app.settings.limits.ipv6_prefix_len)
                .ok_or_else(|| ApiError::invalid(format!("ip {ip:.64?} is not an IP address")))?;
            Ok(crate::model::SubjectKey::ip(&ip))
        }
        (None, None, Some(device)) => ids.device_key(device).map_err(invalid),
        _ => Err(ApiError::invalid(
            "name exactly one of account, ip and device_id",
        )),
    }
}

/// A page size within `1..=max` (default `default`).
pub(super) fn parse_limit(limit: Option<u32>, default: u32, max: u32) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::invalid(format!(
            "limit must be between 1 and {max}"
        )))
    }
}

/// Parses a request's query string like [`ApiQuery`] does, when the handler decides to.
pub(super) fn parse_query<T: serde::de::DeserializeOwned>(
    uri: &axum::http::Uri,
) -> Result<T, ApiError> {
    refuse_nul(uri.query().unwrap_or(""))?;
    let axum::extract::Query(value) = axum::extract::Query::<T>::try_from_uri(uri)?;
    Ok(value)
}
