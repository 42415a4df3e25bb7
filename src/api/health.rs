//! Unauthenticated operational routes: liveness, readiness, metrics, the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorCode};
use crate::app::AppState;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
}

/// The API reference's paths and their handlers (not in the OpenAPI document).
pub(super) fn pages() -> [(&'static str, axum::routing::MethodRouter<AppState>); 2] {
    [
        ("/docs", axum::routing::get(docs_page)),
        ("/docs/redoc.js", axum::routing::get(docs_script)),
    ]
}

/// Redoc 2.5.4 (MIT), gzip-compressed (`assets/SOURCES.md`).
const REDOC_JS_GZ: &[u8] = include_bytes!("../../assets/redoc.standalone.js.gz");

/// The interactive API reference: Redoc over `/openapi.json`, every asset served from here.
async fn docs_page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; \
                 style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src blob:",
            ),
        ],
        DOCS_HTML,
    )
}

const DOCS_HTML: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Palisade API</title>
</head>
<body>
<div id="redoc"></div>
<script src="/docs/redoc.js"></script>
<script>Redoc.init("/openapi.json", {}, document.getElementById("redoc"));</script>
</body>
</html>
"#;

async fn docs_script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CONTENT_ENCODING, "gzip"),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        REDOC_JS_GZ,
    )
}

/// Liveness answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: &'static str,
}

/// State of one store.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StoreState {
    /// `postgres`, `sqlite`, `redis` or `memory`.
    pub kind: &'static str,
    /// Whether it answered.
    pub ok: bool,
    /// Why not, if it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Readiness answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready`.
    pub status: &'static str,
    /// The durable store.
    pub durable: StoreState,
    /// The hot store.
    pub hot: StoreState,
    /// Whether the hot store's enforcement state is complete, or being rebuilt from the
    /// durable store after it lost its data (`phase`: `current`, `rebuilding`, `waiting`).
    pub hot_state: crate::recovery::HotState,
}

/// Liveness: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: both stores answer, and the hot store answers the limit checks' own commands
/// (three failures in a row make it unready until the next answer). 503 `UNAVAILABLE` (with
/// each store's state in `details`) while one does not: whenever a fail-closed class would
/// answer 503.
#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
    (status = 200, body = Readiness),
    (status = 503, body = super::error::Envelope),
))]
async fn readyz(State(app): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    let (durable, hot) = tokio::join!(app.stores.durable.ping(), app.stores.hot.ping());
    let state = |kind, result: Result<(), crate::store::Error>| StoreState {
        kind,
        ok: result.is_ok(),
        error: result.err().map(|err| err.to_string()),
    };
    // A cluster answers PING from its other nodes while one slot's master is gone and every
    // check on that slot times out: enforcement's own outcomes count too.
    let hot = hot.and_then(|()| {
        if app.stores.hot.answers() {
            Ok(())
        } else {
            Err(crate::store::Error::Unavailable {
                store: "hot",
                source:
                    "the last commands of the limit checks failed (fail-closed classes answer 503)"
                        .into(),
            })
        }
    });
    let durable = state(app.stores.durable.kind(), durable);
    let hot = state(app.stores.hot.kind(), hot);
    for (name, store) in [("durable", &durable), ("hot", &hot)] {
        if !store.ok {
            metrics::counter!(crate::telemetry::metrics::STORE_UNAVAILABLE_TOTAL, "store" => name)
                .increment(1);
        }
    }
    if durable.ok && hot.ok {
        Ok(Json(Readiness {
            status: "ready",
            durable,
            hot,
            hot_state: app.recovery.state(),
        }))
    } else {
        let details = serde_json::json!({ "durable": durable, "hot": hot, "hot_state": app.recovery.state() });
        Err(ApiError::new(ErrorCode::Unavailable, "a store is unreachable").with_details(details))
    }
}

/// Prometheus metrics, text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, content_type = "text/plain", body = String)))]
async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::telemetry::metrics::render(&app.metrics),
    )
}

/// This OpenAPI 3 document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, body = Object)))]
async fn openapi_json() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi_json_bytes(),
    )
}
