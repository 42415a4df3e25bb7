//! The per-request layer: request id, tracing span, panic catcher, timeout, metrics, and the
//! envelope for error responses made outside handlers.
//!
//! One hand-written `tower` layer instead of four stacked ones (`from_fn`, tower-http's
//! `CatchPanicLayer` and `TimeoutLayer`): each layer adds a future and a service clone per
//! request, and on the cheapest routes (`/v1/multipliers` from the L1, `/healthz`) that
//! framework cost is most of the request.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tracing::Instrument;

use super::error::{self, ApiError, ErrorCode};
use super::{method_label, request_id, route_label, status_label};
use crate::telemetry::metrics as names;

/// Wraps every route in [`RequestContext`].
#[derive(Debug, Clone, Copy)]
pub(super) struct RequestContextLayer {
    limits: Limits,
}

/// What the context refuses before routing.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Requests taking longer are answered 503.
    timeout: Duration,
    /// A declared `Content-Length` above it is answered 413 at once (the body is not read).
    body_limit_bytes: usize,
}

/// Longest request target (path and query) answered; longer is 414.
pub(super) const MAX_URI_BYTES: usize = 8 * 1024;
/// Most request headers answered; more, or more than [`MAX_HEADER_BYTES`] of them, is 431.
/// hyper's own default for HTTP/1.1, which refuses more before this runs (`api::serve`).
pub(super) const MAX_HEADERS: usize = 100;
/// Largest total size of the request headers (names and values) answered.
pub(super) const MAX_HEADER_BYTES: usize = 16 * 1024;

impl RequestContextLayer {
    /// Requests taking longer than `timeout` are answered 503; a declared body above
    /// `body_limit_bytes` is answered 413 before it is read.
    pub(super) fn new(timeout: Duration, body_limit_bytes: usize) -> Self {
        Self {
            limits: Limits {
                timeout,
                body_limit_bytes,
            },
        }
    }
}

impl<S> tower::Layer<S> for RequestContextLayer {
    type Service = RequestContext<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestContext {
            inner,
            limits: self.limits,
        }
    }
}

/// The service [`RequestContextLayer`] makes.
#[derive(Debug, Clone)]
pub(super) struct RequestContext<S> {
    inner: S,
    limits: Limits,
}

impl<S> tower::Service<Request> for RequestContext<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        Box::pin(handle(&mut self.inner, request, self.limits).map(Ok))
    }
}

/// A request the server refuses before routing it: a target, headers or a declared body
/// beyond the limits (in the envelope, with the status HTTP names for it).
fn refused_at_the_edge(request: &Request, limits: Limits) -> Option<ApiError> {
    use axum::http::StatusCode;
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |t| t.as_str().len());
    if target > MAX_URI_BYTES {
        return Some(
            ApiError::invalid(format!(
                "the request target is longer than {MAX_URI_BYTES} bytes"
            ))
            .with_status(StatusCode::URI_TOO_LONG),
        );
    }
    let headers = request.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return Some(
            ApiError::invalid(format!(
                "the request headers exceed {MAX_HEADERS} headers or {MAX_HEADER_BYTES} bytes"
            ))
            .with_status(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        );
    }
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limits.body_limit_bytes as u64) {
        return Some(
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the declared body is larger than the limit of {} bytes",
                    limits.body_limit_bytes
                ),
            )
            // The body is not read: the connection cannot carry another request.
            .with_header(
                axum::http::header::CONNECTION,
                HeaderValue::from_static("close"),
            ),
        );
    }
    None
}

/// Reads and drops the body of a refused request for a while (at most the request timeout,
/// and 16 times the body limit), so that a client still sending it reads the answer instead
/// of a connection reset; then the connection closes (the answer says `Connection: close`).
fn drain_in_background(body: axum::body::Body, limits: Limits) {
    use http_body_util::BodyExt;
    let most = limits.body_limit_bytes.saturating_mul(16);
    tokio::spawn(async move {
        let mut body = body;
        let mut read = 0usize;
        let drain = async {
            while let Some(Ok(frame)) = body.frame().await {
                read += frame.data_ref().map_or(0, |d| d.len());
                if read > most {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(limits.timeout, drain).await;
    });
}

/// Counts a request and records its latency (handles cached: this runs for every request).
fn record_request(route: &'static str, method: &'static str, status: &'static str, seconds: f64) {
    use std::sync::LazyLock;
    type Requests = names::Handles<(&'static str, &'static str, &'static str), metrics::Counter>;
    type Durations = names::Handles<(&'static str, &'static str), metrics::Histogram>;
    static REQUESTS: LazyLock<Requests> = LazyLock::new(Requests::new);
    static DURATIONS: LazyLock<Durations> = LazyLock::new(Durations::new);
    REQUESTS.with(
        (route, method, status),
        || metrics::counter!(names::HTTP_REQUESTS_TOTAL, "route" => route, "method" => method, "status" => status),
        |counter| counter.increment(1),
    );
    DURATIONS.with(
        (route, method),
        || metrics::histogram!(names::HTTP_REQUEST_DURATION_SECONDS, "route" => route, "method" => method),
        |histogram| histogram.record(seconds),
    );
}

/// Starts serving `request` on `inner` (polled ready; its future owns what it needs, so no
/// clone of the service moves into this one) and returns the future of the whole exchange.
fn handle<S>(
    inner: &mut S,
    request: Request,
    limits: Limits,
) -> impl Future<Output = Response> + Send + 'static
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    let started = Instant::now();
    let request_id = request_id::from_headers(request.headers());
    let header = HeaderValue::from_str(&request_id).ok();
    let method = request.method().clone();
    let route = route_label(
        request
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str),
    );
    // Only the id: method and route are on the completion event and in the metrics, and
    // every span field is formatted on every request. `status` and `latency_ms` go on the
    // completion event too: recording into a span re-formats its fields.
    let span = tracing::info_span!("request", request_id = %request_id);
    // Kept for an error envelope's message only; `Uri` clones share its bytes.
    let uri = request.uri().clone();
    let timeout = limits.timeout;
    // The route's future: calling the service only builds it (the handler runs when it is
    // polled, inside the span, the timeout and the panic catcher).
    let serving = match refused_at_the_edge(&request, limits) {
        Some(refused) => {
            drain_in_background(request.into_body(), limits);
            Err(refused)
        }
        None => Ok(inner.call(request)),
    };
    let handled = async move {
        let served = match serving {
            Err(refused) => Ok(Ok(Ok(refused.into_response()))),
            Ok(future) => {
                tokio::time::timeout(timeout, AssertUnwindSafe(future).catch_unwind()).await
            }
        };
        let mut response = match served {
            Ok(Ok(Ok(response))) => response,
            Ok(Ok(Err(never))) => match never {},
            Ok(Err(_panic)) => ApiError::internal("handler panicked").into_response(),
            Err(_elapsed) => ApiError::new(
                ErrorCode::Unavailable,
                format!("the request took longer than {} ms", timeout.as_millis()),
            )
            .into_response(),
        };
        let status = response.status();
        if (status.is_client_error() || status.is_server_error())
            && response
                .extensions()
                .get::<error::EnvelopeRendered>()
                .is_none()
        {
            let headers = response.headers().clone();
            response = error::envelope_for_status(status, &headers, method.as_str(), uri.path());
        }
        if let Some(value) = header {
            response
                .headers_mut()
                .insert(request_id::REQUEST_ID_HEADER, value);
        }
        let latency = started.elapsed();
        let status = response.status();
        let latency_ms = latency.as_secs_f64() * 1000.0;
        let method = method_label(&method);
        if status.is_server_error() {
            tracing::warn!(
                method,
                route,
                status = status.as_u16(),
                latency_ms,
                "answered {status}"
            );
        } else {
            tracing::debug!(
                method,
                route,
                status = status.as_u16(),
                latency_ms,
                "answered {status}"
            );
        }
        record_request(route, method, status_label(status), latency.as_secs_f64());
        response
    };
    request_id::scope(request_id, handled.instrument(span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use tower::ServiceExt;

    fn app() -> Router {
        Router::new()
            .route("/ok", get(|| async { "ok" }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    "late"
                }),
            )
            .route(
                "/panic",
                get(|| async {
                    let input: Vec<&str> = Vec::new();
                    // A handler bug: indexing past the end.
                    input[std::hint::black_box(0)]
                }),
            )
            .layer(RequestContextLayer::new(Duration::from_millis(50), 1024))
    }

    async fn call(path: &str) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
        let response = app()
            .oneshot(
                Request::builder()
                    .uri(path)
                    .header("x-request-id", "req-1")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (parts.status, parts.headers, json)
    }

    #[tokio::test]
    async fn a_slow_handler_is_a_503_envelope_after_the_timeout() {
        tokio::time::pause();
        let (status, headers, body) = call("/slow").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body["error"]["code"], "UNAVAILABLE");
        assert_eq!(body["error"]["request_id"], "req-1");
        assert_eq!(headers["x-request-id"], "req-1");
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_500_envelope_and_the_service_goes_on() {
        let (status, _, body) = call("/panic").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["code"], "INTERNAL");
        assert_eq!(call("/ok").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn errors_made_outside_handlers_get_the_envelope() {
        let (status, headers, body) = call("/nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["code"], "NOT_FOUND");
        assert_eq!(headers["x-request-id"], "req-1");
    }
}
