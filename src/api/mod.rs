//! HTTP edge: every route, its role and its OpenAPI entry are registered here.
//!
//! Owns routing, the request middleware (request id, span, metrics, envelope), extractors
//! ([`extract`]), the error envelope ([`error`]) and the JSON shapes of each area. Handlers
//! are thin: extract, authorise, call one domain method, shape the response.

pub mod admin;
pub mod analyst;
pub mod attestations;
mod automatic;
mod console;
mod context;
pub mod decisions;
pub mod envoy;
pub mod envoy_proto;
mod envoy_rules;
pub mod error;
pub mod events;
pub mod extract;
mod gateway;
pub mod guard;
pub mod health;
pub mod layer;
pub mod limit;
pub mod lists;
pub mod lockouts;
pub mod messaging;
mod policy;
pub mod reputation;
pub mod request_id;
mod schema;
pub mod scoring;
mod suggestions;

use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Request;
use axum::http::StatusCode;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;

pub use error::{ApiError, ErrorCode};

use crate::app::AppState;

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
    let mut doc = api_routes().split_for_parts().1;
    schema::require_custom_parameters(&mut doc);
    doc
}

/// `/openapi.json`'s body, rendered once per process.
fn openapi_json_bytes() -> axum::body::Bytes {
    static DOC: std::sync::OnceLock<axum::body::Bytes> = std::sync::OnceLock::new();
    DOC.get_or_init(|| serde_json::to_vec(&openapi()).unwrap_or_default().into())
        .clone()
}

/// A metric label for a matched route: its pattern, read from the routes the router was
/// built with (the OpenAPI document's paths and the pages beside them), so labels are few,
/// fixed and never allocated per request. A pattern not among them is `other`.
fn route_label(route: Option<&str>) -> &'static str {
    static ROUTES: std::sync::LazyLock<std::collections::HashSet<Box<str>>> =
        std::sync::LazyLock::new(|| {
            let documented = openapi()
                .paths
                .paths
                .into_keys()
                .map(String::into_boxed_str);
            let pages = page_routes().map(|(path, _)| Box::from(path));
            documented.chain(pages).collect()
        });
    let Some(route) = route else {
        return "unmatched";
    };
    ROUTES.get(route).map_or("other", |label| &**label)
}

/// The pages served beside the API (the console, the API reference): routes of their own,
/// outside the OpenAPI document.
fn page_routes() -> impl Iterator<Item = (&'static str, axum::routing::MethodRouter<AppState>)> {
    console::pages().into_iter().chain(health::pages())
}

/// A metric label for a method, without allocating.
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// A metric label for a status, without allocating for the statuses this service answers.
fn status_label(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200 => "200",
        201 => "201",
        204 => "204",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        409 => "409",
        413 => "413",
        429 => "429",
        500 => "500",
        503 => "503",
        s if s < 400 => "2xx-3xx",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

fn api_routes() -> OpenApiRouter<AppState> {
    let documented = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(health::routes())
        .merge(admin::routes())
        .merge(limit::routes())
        .merge(events::routes())
        .merge(messaging::routes())
        .merge(lockouts::routes())
        .merge(analyst::routes())
        .merge(decisions::routes())
        .merge(policy::routes())
        .merge(suggestions::routes())
        .merge(reputation::routes())
        .merge(lists::routes())
        .merge(scoring::routes())
        .merge(guard::routes())
        .merge(attestations::routes())
        .merge(gateway::routes());
    page_routes().fold(documented, |routes, (path, page)| routes.route(path, page))
}

/// Builds the whole HTTP application.
///
/// Layers: the last `.layer` call is the outermost. Order, outermost first: request
/// context (id, span, panic catcher, timeout, metrics, envelope: one layer, one future per
/// request, see [`context`]) → body limit → routes. (The OpenAPI document is rendered once,
/// not carried as a per-request extension.)
pub fn router(state: AppState) -> Router {
    let (routes, _) = api_routes().split_for_parts();
    let http = &state.settings.http;
    routes
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(http.body_limit_bytes))
        .layer(context::RequestContextLayer::new(
            Duration::from_millis(http.request_timeout_ms),
            http.body_limit_bytes,
        ))
        .with_state(state)
}

async fn fallback(request: axum::extract::Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        request.method(),
        request.uri().path()
    ))
}

/// A listener bound to `addr` with the backlog `http.listen_backlog`.
pub fn bind(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Serves `state` on a bound listener until `shutdown` completes, then drains requests.
///
/// Tests bind `127.0.0.1:0`; `palisade serve` binds `PALISADE_LISTEN` ([`bind`]). HTTP/1.1
/// and HTTP/2 (prior knowledge) on one port. A client that does not send its headers
/// within `http.header_read_timeout_ms`, or leaves a kept-alive connection idle that long, is
/// disconnected (slowloris); HTTP/2 connections are pinged and closed when the peer is gone.
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use tower::ServiceExt;

    let header_timeout = Duration::from_millis(state.settings.http.header_read_timeout_ms);
    let clock = state.clock.clone();
    let app = router(state);
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    // hyper's own limit of headers is left at its default (100, the request context's
    // `MAX_HEADERS`): parsed into arrays on the stack, where a limit set here puts two arrays
    // of that many headers on the heap for every request. A request with more gets hyper's
    // 431, written as the envelope by `automatic::Enveloped`.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors or a connection reset before accept: wait a
                    // moment rather than spin.
                    tracing::warn!(error.cause = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // TCP_NODELAY: an answer is written as soon as it is ready, not held back by Nagle's
        // algorithm until the client acknowledges an earlier segment.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error.cause = %err, "could not set TCP_NODELAY");
        }
        let app = app.clone();
        let service =
            hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                app.clone().oneshot(request.map(axum::body::Body::new))
            });
        let connection = builder
            .serve_connection_with_upgrades(
                TokioIo::new(automatic::Enveloped::new(stream, clock.clone())),
                service,
            )
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error.cause = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The size of the future `handler` returns, found without calling it. Every request
/// allocates its handler's future and moves it into place, so a large one costs every
/// request (a rare path held inline makes a limit check's future 19.8 KB).
#[cfg(test)]
pub(crate) fn future_size<A, F: std::future::Future>(_handler: impl Fn(A) -> F) -> usize {
    std::mem::size_of::<F>()
}

#[cfg(test)]
mod tests {
    use super::{openapi, page_routes, route_label};

    #[test]
    fn every_route_is_labelled_by_its_own_pattern_and_nothing_else_is() {
        let documented = openapi().paths.paths;
        assert!(
            documented.len() > 40,
            "{} documented paths",
            documented.len()
        );
        for path in documented.keys() {
            assert_eq!(route_label(Some(path)), path);
        }
        for (path, _) in page_routes() {
            assert_eq!(route_label(Some(path)), path);
        }
        assert_eq!(route_label(Some("/v1/not-a-route/{id}")), "other");
        assert_eq!(route_label(None), "unmatched");
    }
}
