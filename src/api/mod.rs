//! HTTP edge: every route, its role and its OpenAPI entry are registered here.
//!
//! Owns routing, the request middleware (request id, span, metrics, envelope), extractors
//! ([`extract`]), the error envelope ([`error`]) and the JSON shapes of each area. Handlers
//! are thin: extract, authorise, call one domain method, shape the response.

pub mod admin;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod limit;
pub mod lists;
pub mod lockouts;
pub mod reputation;
pub mod request_id;
pub mod scoring;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::TimeoutLayer;
use tracing::Instrument;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;

pub use error::{ApiError, ErrorCode};

use crate::app::AppState;
use crate::telemetry::metrics as names;

/// The OpenAPI document's fixed parts; paths are added by route registration.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Palisade",
        description = "Abuse-signal and reputation engine for mobile backends. Every /v1 route \
                       needs `Authorization: Bearer <token>` of the role named in its description \
                       (admin may call all). Errors use the envelope `{\"error\":{code,message,details,request_id}}`."
    ),
    modifiers(&BearerAuth),
    components(schemas(error::Envelope, error::ErrorCode))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document of every route (the same one `/openapi.json` serves).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_routes().split_for_parts().1
}

fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(health::routes())
        .merge(admin::routes())
        .merge(limit::routes())
        .merge(events::routes())
        .merge(lockouts::routes())
        .merge(reputation::routes())
        .merge(lists::routes())
        .merge(scoring::routes())
}

/// Builds the whole HTTP application.
///
/// Layers: the last `.layer` call is the outermost. Order, outermost first: request
/// context (id, span, metrics, envelope) → panic catcher → timeout → body limit → routes.
pub fn router(state: AppState) -> Router {
    let (routes, openapi) = api_routes().split_for_parts();
    let http = &state.settings.http;
    routes
        .fallback(fallback)
        .layer(axum::Extension(Arc::new(openapi)))
        .layer(DefaultBodyLimit::max(http.body_limit_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            Duration::from_millis(http.request_timeout_ms),
        ))
        .layer(CatchPanicLayer::custom(
            |_panic: Box<dyn std::any::Any + Send>| {
                ApiError::internal("handler panicked").into_response()
            },
        ))
        .layer(middleware::from_fn(request_context))
        .with_state(state)
}

async fn fallback(request: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        request.method(),
        request.uri().path()
    ))
}

/// Request id, tracing span, metrics and the envelope for errors made outside handlers.
async fn request_context(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = request_id::from_headers(request.headers());
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = %method,
        route = %route,
        status = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
    );
    let mut response = request_id::scope(
        request_id.clone(),
        next.run(request).instrument(span.clone()),
    )
    .await;

    let status = response.status();
    if (status.is_client_error() || status.is_server_error())
        && response
            .extensions()
            .get::<error::EnvelopeRendered>()
            .is_none()
    {
        let headers = response.headers().clone();
        response = request_id::scope(request_id.clone(), async {
            error::envelope_for_status(status, &headers, method.as_str(), &path)
        })
        .instrument(span.clone())
        .await;
    }
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response
            .headers_mut()
            .insert(request_id::REQUEST_ID_HEADER, value);
    }

    let latency = started.elapsed();
    let status = response.status();
    span.record("status", status.as_u16());
    span.record("latency_ms", latency.as_secs_f64() * 1000.0);
    span.in_scope(|| {
        if status.is_server_error() {
            tracing::warn!("answered {status}");
        } else {
            tracing::debug!("answered {status}");
        }
    });
    let labels = [
        ("route", route),
        ("method", method.to_string()),
        ("status", status.as_u16().to_string()),
    ];
    metrics::counter!(names::HTTP_REQUESTS_TOTAL, &labels).increment(1);
    metrics::histogram!(names::HTTP_REQUEST_DURATION_SECONDS, &labels[..2])
        .record(latency.as_secs_f64());
    response
}

/// Serves `state` on a bound listener until `shutdown` completes, then drains requests.
///
/// Tests bind `127.0.0.1:0`; `palisade serve` binds `PALISADE_LISTEN`.
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
