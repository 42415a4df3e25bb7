//! The analyst console: one page and its script and style, embedded in the binary and
//! served at `/console`. It signs in with an API token kept in session storage and calls
//! the `/v1` API like any client; nothing here bypasses a role check.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get};

use crate::app::AppState;

/// The console's paths and their handlers (not in the OpenAPI document).
pub(super) fn pages() -> [(&'static str, MethodRouter<AppState>); 5] {
    [
        ("/console", get(page)),
        ("/console/", get(page)),
        ("/console/app.js", get(script)),
        ("/console/budgets.js", get(budgets_script)),
        ("/console/app.css", get(style)),
    ]
}

const PAGE: &str = include_str!("../../assets/console/index.html");
const SCRIPT: &str = include_str!("../../assets/console/app.js");
const BUDGETS_SCRIPT: &str = include_str!("../../assets/console/budgets.js");
const STYLE: &str = include_str!("../../assets/console/app.css");

/// Only this origin's script and style, no framing, no referrer (tokens never travel in
/// URLs, but account names do).
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; \
    frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
            // Revalidated on each load: a new binary's console is used at once.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

async fn page() -> impl IntoResponse {
    asset("text/html; charset=utf-8", PAGE)
}

async fn script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn budgets_script() -> impl IntoResponse {
    asset("text/javascript; charset=utf-8", BUDGETS_SCRIPT)
}

async fn style() -> impl IntoResponse {
    asset("text/css; charset=utf-8", STYLE)
}
