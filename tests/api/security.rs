//! The role table of DESIGN.md, walked over every route of the OpenAPI document: no token
//! and a wrong token get 401, each role gets 403 exactly where the table says so.

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::{ADMIN_TOKEN, TestApp};
use crate::on_both_backends;

on_both_backends!(every_route_enforces_the_role_table);

/// `(method, path, role)`: the role a route needs (`admin` passes everywhere; `a|b`: either),
/// or `None` for the public routes. DESIGN.md's table plus our additions (README "Deviations").
const ROLE_TABLE: &[(&str, &str, Option<&str>)] = &[
    ("get", "/healthz", None),
    ("get", "/readyz", None),
    ("get", "/metrics", None),
    ("get", "/openapi.json", None),
    ("post", "/v1/events/auth", Some("ingest")),
    ("post", "/v1/events/messaging", Some("ingest")),
    ("get", "/v1/accounts/{account}/status", Some("ingest")),
    ("post", "/v1/attestations/challenge", Some("ingest")),
    ("post", "/v1/attestations", Some("ingest")),
    ("post", "/v1/events/requests", Some("limiter")),
    ("post", "/v1/limit/check", Some("limiter")),
    ("get", "/v1/multipliers", Some("limiter|analyst")),
    ("get", "/v1/decisions", Some("limiter")),
    ("get", "/v1/reputation/{ip}", Some("limiter|analyst")),
    ("get", "/v1/forward-auth", Some("limiter")),
    ("get", "/crowdsec/v1/decisions/stream", Some("limiter")),
    ("get", "/crowdsec/v1/decisions", Some("limiter")),
    ("get", "/v1/lockouts", Some("analyst")),
    ("get", "/v1/lockouts/{id}", Some("analyst")),
    ("post", "/v1/lockouts/{id}/release", Some("analyst")),
    ("post", "/v1/lockouts/release", Some("analyst")),
    ("get", "/v1/accounts/failing", Some("analyst")),
    ("get", "/v1/accounts/{account}/timeline", Some("analyst")),
    ("post", "/v1/penalties/clear", Some("analyst")),
    ("get", "/v1/stats/decisions", Some("analyst")),
    ("get", "/v1/history", Some("analyst")),
    ("patch", "/v1/lockouts/{id}", Some("analyst")),
    ("get", "/v1/accounts/{account}/export", Some("analyst")),
    ("post", "/v1/accounts/{account}/erase", Some("admin")),
    ("get", "/v1/events/auth", Some("analyst")),
    ("post", "/v1/policy/simulate", Some("admin")),
    ("post", "/v1/overrides", Some("admin")),
    ("get", "/v1/overrides", Some("analyst")),
    ("delete", "/v1/overrides/{id}", Some("admin")),
    ("post", "/v1/policy/candidates", Some("admin")),
    ("get", "/v1/policy/candidates/last", Some("analyst")),
    ("get", "/v1/policy/suggestions", Some("admin")),
    ("get", "/v1/policy/candidates/current", Some("analyst")),
    ("delete", "/v1/policy/candidates/current", Some("admin")),
    (
        "post",
        "/v1/policy/candidates/current/promote",
        Some("admin"),
    ),
    ("get", "/v1/policy/live", Some("analyst")),
    ("post", "/v1/policy/live/revert", Some("admin")),
    ("get", "/v1/export/{provider}", Some("admin")),
    ("get", "/v1/offenders", Some("analyst")),
    ("get", "/v1/login-guard", Some("analyst")),
    ("post", "/v1/login-guard/release", Some("analyst")),
    ("get", "/v1/alerts", Some("analyst")),
    ("get", "/v1/lists/{list}", Some("analyst")),
    ("post", "/v1/lists/{list}", Some("analyst")),
    ("delete", "/v1/lists/{list}/{id}", Some("analyst")),
    ("get", "/v1/attestations/{device_id}", Some("analyst")),
    ("post", "/v1/admin/tokens", Some("admin")),
    ("get", "/v1/admin/tokens", Some("admin")),
    ("delete", "/v1/admin/tokens/{id}", Some("admin")),
    ("get", "/v1/audit", Some("analyst")),
    ("post", "/v1/admin/reload", Some("admin")),
];

/// A concrete path for a templated one.
fn concrete(path: &str) -> String {
    path.replace("{account}", "alice")
        .replace("{ip}", "192.0.2.1")
        .replace("{list}", "deny")
        .replace("{device_id}", "phone-1")
        .replace("{id}", "01ARZ3NDEKTSV4RRFFQ69G5FAV")
        .replace("{provider}", "cloudflare")
}

async fn call(app: &TestApp, method: &str, path: &str, token: Option<&str>) -> StatusCode {
    let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
    let mut request = app.client.request(method, app.url(&concrete(path)));
    if let Some(token) = token {
        // The CrowdSec route reads X-Api-Key, every other one Authorization.
        request = request.bearer_auth(token).header("x-api-key", token);
    }
    request.send().await.unwrap().status()
}

async fn every_route_enforces_the_role_table(app: TestApp) {
    // The table covers exactly the routes the service documents.
    let doc: Value = app.get("/openapi.json", None).await.json().await.unwrap();
    let mut documented: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    let mut tabled: Vec<(String, String)> = ROLE_TABLE
        .iter()
        .map(|(m, p, _)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    documented.sort();
    tabled.sort();
    assert_eq!(
        documented, tabled,
        "the role table and the OpenAPI document differ"
    );

    let mut tokens = vec![];
    for role in ["ingest", "limiter", "analyst", "admin"] {
        let (_, token) = app.create_token(role, &format!("walker-{role}")).await;
        tokens.push((role, token));
    }
    let mut failures = Vec::new();
    for (method, path, needed) in ROLE_TABLE {
        let Some(needed) = needed else {
            let status = call(&app, method, path, None).await;
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                failures.push(format!("{method} {path} is public but answered {status}"));
            }
            continue;
        };
        for (label, token) in [("no token", None), ("wrong token", Some("pal_wrong"))] {
            let status = call(&app, method, path, token).await;
            if status != StatusCode::UNAUTHORIZED {
                failures.push(format!("{method} {path} with {label}: {status}, not 401"));
            }
        }
        // The bootstrap token is retired: an admin token exists now.
        for (role, token) in tokens
            .iter()
            .map(|(r, t)| (*r, t.as_str()))
            .chain([("retired bootstrap", ADMIN_TOKEN)])
        {
            let status = call(&app, method, path, Some(token)).await;
            let allowed = needed.split('|').any(|n| n == role) || role == "admin";
            let refused = status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED;
            if allowed == refused {
                failures.push(format!("{method} {path} as {role}: {status}"));
            }
            if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
                failures.push(format!("{method} {path} as {role}: {status} (a 5xx)"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "role table violations:\n{}",
        failures.join("\n")
    );
}
