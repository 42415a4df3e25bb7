//! Foundation: envelope, request ids, tokens and roles, audit, readiness, OpenAPI.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_TOKEN, Backend, ChaosProxy, TestApp, assert_envelope, production_urls, socket_of,
};
use crate::on_both_backends;

on_both_backends!(
    healthz_answers_with_a_ulid_request_id,
    sane_incoming_request_id_is_echoed,
    missing_or_unknown_token_gets_401_envelope,
    analyst_token_is_forbidden_on_admin_routes,
    token_lifecycle_create_use_revoke_is_audited,
    token_names_and_roles_are_validated,
    bootstrap_token_cannot_be_revoked_through_the_api,
    malformed_json_gets_invalid_argument_envelope,
    unknown_route_and_wrong_method_get_envelopes,
    oversized_body_gets_payload_too_large_envelope,
    audit_pages_newest_first_with_a_cursor,
    readyz_reports_both_stores,
    openapi_document_lists_every_route,
    nul_characters_are_a_400_never_a_database_error,
);

async fn healthz_answers_with_a_ulid_request_id(app: TestApp) {
    let response = app.get("/healthz", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    let id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(ulid::Ulid::from_string(&id).is_ok(), "{id}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!({"status": "ok"}));
}

async fn sane_incoming_request_id_is_echoed(app: TestApp) {
    let response = app
        .client
        .get(app.url("/v1/audit"))
        .header("x-request-id", "gateway-req-42")
        .send()
        .await
        .unwrap();
    let body = assert_envelope(response, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
    assert_eq!(body["error"]["request_id"], "gateway-req-42");
}

async fn missing_or_unknown_token_gets_401_envelope(app: TestApp) {
    assert_envelope(
        app.get("/v1/audit", None).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    assert_envelope(
        app.get("/v1/audit", Some("pal_not_a_real_token")).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    let basic = app
        .client
        .get(app.url("/v1/audit"))
        .header("authorization", "Basic dXNlcjpwYXNz")
        .send()
        .await
        .unwrap();
    assert_envelope(basic, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
}

async fn analyst_token_is_forbidden_on_admin_routes(app: TestApp) {
    let (_, analyst) = app.create_token("analyst", "alice").await;
    let body = assert_envelope(
        app.get("/v1/admin/tokens", Some(&analyst)).await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
    assert!(body["error"]["message"].as_str().unwrap().contains("admin"));
    let create = app
        .post(
            "/v1/admin/tokens",
            Some(&analyst),
            &json!({"role": "admin", "name": "escalate", "reason": "x"}),
        )
        .await;
    assert_envelope(create, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    // Role is checked before the body is read: a bad body from the wrong role is still 403.
    let bad = app
        .client
        .post(app.url("/v1/admin/tokens"))
        .bearer_auth(&analyst)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_envelope(bad, StatusCode::FORBIDDEN, "FORBIDDEN").await;
}

async fn token_lifecycle_create_use_revoke_is_audited(app: TestApp) {
    let (ops, admin) = app.create_token("admin", "ops-0").await;
    // An admin token exists: the bootstrap token is retired, on this instance at once.
    assert_envelope(
        app.get("/v1/audit", Some(ADMIN_TOKEN)).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    let created = app
        .post(
            "/v1/admin/tokens",
            Some(&admin),
            &json!({"role": "admin", "name": "ops-1", "reason": "second operator"}),
        )
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let created: Value = created.json().await.unwrap();
    let (id, token) = (
        created["id"].as_str().unwrap().to_owned(),
        created["token"].as_str().unwrap().to_owned(),
    );
    assert!(token.starts_with("pal_") && token.len() == 68, "{token}");
    assert_eq!(
        app.get("/v1/audit", Some(&token)).await.status(),
        StatusCode::OK
    );

    let listed: Value = app
        .get("/v1/admin/tokens", Some(&admin))
        .await
        .json()
        .await
        .unwrap();
    let entry = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id.as_str())
        .expect("listed");
    assert_eq!(entry["name"], "ops-1");
    assert!(entry.get("token").is_none(), "secret must never be listed");

    let revoked = app
        .request(
            Method::DELETE,
            &format!("/v1/admin/tokens/{id}?reason=rotated"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(revoked.status(), StatusCode::OK);
    let revoked: Value = revoked.json().await.unwrap();
    assert!(revoked["revoked_at"].is_string());
    assert_envelope(
        app.get("/v1/audit", Some(&token)).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    // Revoking again changes nothing and is not audited twice.
    let again = app
        .request(
            Method::DELETE,
            &format!("/v1/admin/tokens/{id}?reason=rotated"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(again.status(), StatusCode::OK);

    let audit: Value = app
        .get("/v1/audit", Some(&admin))
        .await
        .json()
        .await
        .unwrap();
    let actions: Vec<(&str, &str, &str)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap(),
                e["target"].as_str().unwrap(),
                e["actor"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            ("token.revoke", id.as_str(), "ops-0"),
            ("token.create", id.as_str(), "ops-0"),
            ("token.create", ops.as_str(), "bootstrap"),
        ]
    );
    let revoked = &audit["items"][0]["details"];
    assert_eq!(revoked["reason"], "rotated", "{audit}");
    let filtered: Value = app
        .get("/v1/audit?action=token.revoke", Some(&admin))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(filtered["items"].as_array().unwrap().len(), 1);
}

async fn token_names_and_roles_are_validated(app: TestApp) {
    app.create_token("ingest", "auth-svc").await;
    let duplicate = app
        .post(
            "/v1/admin/tokens",
            Some(ADMIN_TOKEN),
            &json!({"role": "limiter", "name": "auth-svc", "reason": "x"}),
        )
        .await;
    assert_envelope(duplicate, StatusCode::CONFLICT, "CONFLICT").await;
    let bad_role = app
        .post(
            "/v1/admin/tokens",
            Some(ADMIN_TOKEN),
            &json!({"role": "root", "name": "x", "reason": "x"}),
        )
        .await;
    assert_envelope(bad_role, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let empty = app
        .post(
            "/v1/admin/tokens",
            Some(ADMIN_TOKEN),
            &json!({"role": "ingest", "name": "  ", "reason": "x"}),
        )
        .await;
    assert_envelope(empty, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let unknown_field = app
        .post(
            "/v1/admin/tokens",
            Some(ADMIN_TOKEN),
            &json!({"role": "ingest", "name": "y", "reason": "x", "admin": true}),
        )
        .await;
    assert_envelope(unknown_field, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    // A token is made, and revoked, for a reason the audit log keeps.
    for no_reason in [
        json!({"role": "ingest", "name": "why-not"}),
        json!({"role": "ingest", "name": "why-not", "reason": " "}),
    ] {
        let refused = app
            .post("/v1/admin/tokens", Some(ADMIN_TOKEN), &no_reason)
            .await;
        assert_envelope(refused, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    let (reasonless, _) = app.create_token("ingest", "kept").await;
    let refused = app
        .request(
            Method::DELETE,
            &format!("/v1/admin/tokens/{reasonless}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(refused, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let missing = app
        .request(
            Method::DELETE,
            "/v1/admin/tokens/01ARZ3NDEKTSV4RRFFQ69G5FAV?reason=cleanup",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(missing, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    // A revoked token's name can be reused.
    let (id, _) = app.create_token("ingest", "rotating").await;
    app.request(
        Method::DELETE,
        &format!("/v1/admin/tokens/{id}?reason=rotated"),
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    app.create_token("ingest", "rotating").await;
}

async fn bootstrap_token_cannot_be_revoked_through_the_api(app: TestApp) {
    let response = app
        .request(
            Method::DELETE,
            "/v1/admin/tokens/bootstrap?reason=cleanup",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(response, StatusCode::CONFLICT, "CONFLICT").await;
    assert_eq!(
        app.get("/v1/audit", Some(ADMIN_TOKEN)).await.status(),
        StatusCode::OK
    );
}

async fn malformed_json_gets_invalid_argument_envelope(app: TestApp) {
    let send = |body: &'static str, content_type: &'static str| {
        app.client
            .post(app.url("/v1/admin/tokens"))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let truncated = send("{\"role\":\"analyst\",", "application/json")
        .await
        .unwrap();
    assert_envelope(truncated, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let wrong_type = send("{\"role\":1,\"name\":[]}", "application/json")
        .await
        .unwrap();
    assert_envelope(wrong_type, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let not_json = send("role=analyst", "application/x-www-form-urlencoded")
        .await
        .unwrap();
    assert_envelope(not_json, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let bad_query = app.get("/v1/audit?limit=lots", Some(ADMIN_TOKEN)).await;
    assert_envelope(bad_query, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let bad_cursor = app
        .get("/v1/audit?cursor=not-a-cursor", Some(ADMIN_TOKEN))
        .await;
    assert_envelope(bad_cursor, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

async fn unknown_route_and_wrong_method_get_envelopes(app: TestApp) {
    assert_envelope(
        app.get("/v1/nope", Some(ADMIN_TOKEN)).await,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
    )
    .await;
    assert_envelope(app.get("/", None).await, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    let put = app.request(Method::PUT, "/healthz", None, None).await;
    assert!(
        put.headers().contains_key("allow"),
        "405 keeps its Allow header"
    );
    assert_envelope(put, StatusCode::METHOD_NOT_ALLOWED, "INVALID_ARGUMENT").await;
}

async fn oversized_body_gets_payload_too_large_envelope(app: TestApp) {
    let big = "x".repeat(app.settings.http.body_limit_bytes + 1);
    let body = format!("{{\"role\":\"ingest\",\"name\":\"{big}\"}}");
    let response = app
        .client
        .post(app.url("/v1/admin/tokens"))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_envelope(response, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE").await;
}

async fn audit_pages_newest_first_with_a_cursor(app: TestApp) {
    for name in ["a", "b", "c"] {
        app.create_token("limiter", name).await;
    }
    let first: Value = app
        .get("/v1/audit?limit=2", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let names = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["details"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&first), vec!["c", "b"]);
    let cursor = first["next_cursor"].as_str().expect("more pages");
    let second: Value = app
        .get(
            &format!("/v1/audit?limit=2&cursor={cursor}"),
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(names(&second), vec!["a"]);
    assert!(second.get("next_cursor").is_none());
    let too_many = app.get("/v1/audit?limit=501", Some(ADMIN_TOKEN)).await;
    assert_envelope(too_many, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

async fn readyz_reports_both_stores(app: TestApp) {
    let response = app.get("/readyz", None).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    let (durable, hot) = match app.backend {
        Backend::Embedded => ("sqlite", "memory"),
        Backend::Production => ("postgres", "redis"),
    };
    assert_eq!(body["durable"]["kind"], durable);
    assert_eq!(body["hot"]["kind"], hot);
}

/// The routes of DESIGN.md implemented so far; each new area adds its own.
pub const IMPLEMENTED_ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("post", "/v1/admin/tokens"),
    ("get", "/v1/admin/tokens"),
    ("delete", "/v1/admin/tokens/{id}"),
    ("get", "/v1/audit"),
    ("post", "/v1/limit/check"),
    ("post", "/v1/events/auth"),
    ("post", "/v1/events/messaging"),
    ("get", "/v1/accounts/{account}/status"),
    ("get", "/v1/lockouts"),
    ("get", "/v1/lockouts/{id}"),
    ("post", "/v1/lockouts/{id}/release"),
    ("post", "/v1/lockouts/release"),
    ("get", "/v1/accounts/failing"),
    ("get", "/v1/accounts/{account}/timeline"),
    ("post", "/v1/penalties/clear"),
    ("get", "/v1/stats/decisions"),
    ("get", "/v1/history"),
    ("patch", "/v1/lockouts/{id}"),
    ("get", "/v1/accounts/{account}/export"),
    ("post", "/v1/accounts/{account}/erase"),
    ("get", "/v1/events/auth"),
    ("post", "/v1/policy/simulate"),
    ("post", "/v1/overrides"),
    ("get", "/v1/overrides"),
    ("delete", "/v1/overrides/{id}"),
    ("post", "/v1/policy/candidates"),
    ("get", "/v1/policy/candidates/last"),
    ("get", "/v1/policy/suggestions"),
    ("get", "/v1/policy/candidates/current"),
    ("delete", "/v1/policy/candidates/current"),
    ("post", "/v1/policy/candidates/current/promote"),
    ("get", "/v1/policy/live"),
    ("post", "/v1/policy/live/revert"),
    ("get", "/v1/export/{provider}"),
    ("get", "/v1/reputation/{ip}"),
    ("post", "/v1/admin/reload"),
    ("get", "/v1/lists/{list}"),
    ("post", "/v1/lists/{list}"),
    ("delete", "/v1/lists/{list}/{id}"),
    ("post", "/v1/events/requests"),
    ("get", "/v1/multipliers"),
    ("get", "/v1/decisions"),
    ("get", "/v1/offenders"),
    ("get", "/v1/login-guard"),
    ("post", "/v1/login-guard/release"),
    ("get", "/v1/alerts"),
    ("post", "/v1/attestations/challenge"),
    ("post", "/v1/attestations"),
    ("get", "/v1/attestations/{device_id}"),
    ("get", "/v1/forward-auth"),
    ("get", "/crowdsec/v1/decisions/stream"),
    ("get", "/crowdsec/v1/decisions"),
];

async fn openapi_document_lists_every_route(app: TestApp) {
    let doc: Value = app.get("/openapi.json", None).await.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for (method, path) in IMPLEMENTED_ROUTES {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing from the OpenAPI document"
        );
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|ops| ops.as_object().unwrap().len())
        .sum();
    assert_eq!(
        documented,
        IMPLEMENTED_ROUTES.len(),
        "the document has routes the test does not know"
    );
    // The same document the library builds.
    assert_eq!(doc, serde_json::to_value(palisade::api::openapi()).unwrap());
}

/// A store going away makes `/readyz` answer 503 naming it; it recovers without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn readyz_is_503_while_a_store_is_down_and_recovers() {
    let Some((db_url, redis_url)) = production_urls() else {
        return;
    };
    let redis_proxy = ChaosProxy::start(socket_of(&redis_url)).await;
    let db_proxy = ChaosProxy::start(socket_of(&db_url)).await;
    let database = crate::helpers::fresh_postgres(&db_url).await;
    let proxied_db = db_proxy.proxied_url(&database);
    let proxied_redis = redis_proxy.proxied_url(&redis_url);
    let app = TestApp::spawn_with(Backend::Production, |settings| {
        settings.database_url = proxied_db;
        settings.redis_url = Some(proxied_redis);
        settings.store.db_timeout_ms = 300;
        settings.store.redis_timeout_ms = 100;
    })
    .await
    .expect("production configured");
    assert_eq!(app.get("/readyz", None).await.status(), StatusCode::OK);

    redis_proxy.break_connections();
    let body = assert_envelope(
        app.get("/readyz", None).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "UNAVAILABLE",
    )
    .await;
    assert_eq!(body["error"]["details"]["hot"]["ok"], false);
    assert_eq!(body["error"]["details"]["durable"]["ok"], true);
    redis_proxy.restore();
    wait_until_ready(&app).await;

    db_proxy.break_connections();
    let body = assert_envelope(
        app.get("/readyz", None).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "UNAVAILABLE",
    )
    .await;
    assert_eq!(body["error"]["details"]["durable"]["ok"], false);
    // Authenticated routes that need the durable store answer 503, never 500.
    let (_, token) = (
        "",
        "pal_0000000000000000000000000000000000000000000000000000000000000000",
    );
    assert_envelope(
        app.get("/v1/audit", Some(token)).await,
        StatusCode::SERVICE_UNAVAILABLE,
        "UNAVAILABLE",
    )
    .await;
    db_proxy.restore();
    wait_until_ready(&app).await;
}

async fn wait_until_ready(app: &TestApp) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if app.get("/readyz", None).await.status() == StatusCode::OK {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready again within 5 s of the store returning"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Postgres cannot store NUL in text; such input must be refused up front, on every route.
async fn nul_characters_are_a_400_never_a_database_error(app: TestApp) {
    let events = r#"{"events":[{"event_id":"n1","type":"login_failure","account":"a","ip":"192.0.2.1","device_id":"x\u0000y"}]}"#;
    let response = app
        .client
        .post(app.url("/v1/events/auth"))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(events)
        .send()
        .await
        .unwrap();
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let list = app
        .post(
            "/v1/lists/deny",
            Some(ADMIN_TOKEN),
            &json!({"value": "192.0.2.1", "reason": "a\u{0}b"}),
        )
        .await;
    assert_envelope(list, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    for path in [
        "/v1/audit?action=a%00b",
        "/v1/lockouts?account=a%00b",
        "/v1/accounts/a%00b/status?ip=192.0.2.1",
    ] {
        assert_envelope(
            app.get(path, Some(ADMIN_TOKEN)).await,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        )
        .await;
    }
}

/// The OpenAPI document is self-consistent: every `$ref` resolves, and a path parameter
/// appears in its path (query parameters are declared `in: query`). Found by schemathesis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_references_resolve_and_parameters_sit_where_they_are_sent() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let doc: Value = app.get("/openapi.json", None).await.json().await.unwrap();
    let text = doc.to_string();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap();
        assert!(schemas.contains_key(name), "unresolvable $ref {name}");
    }
    for (path, operations) in doc["paths"].as_object().unwrap() {
        for (method, operation) in operations.as_object().unwrap() {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let name = parameter["name"].as_str().unwrap();
                if parameter["in"] == "path" {
                    assert!(
                        path.contains(&format!("{{{name}}}")),
                        "{method} {path}: `{name}` is declared in the path but is not in it"
                    );
                }
            }
        }
    }
}

/// A fresh process exposes every series whose labels are known at start at 0 (dashboards
/// show 0, not "no data"), its build and the `process_*` metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exist_at_zero_from_the_start_with_build_and_process_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("m.db").display());
    let process = crate::helpers::Process::start(&[("PALISADE_DATABASE_URL", db)]).await;
    let text = reqwest::get(format!("{}/metrics", process.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"palisade_limit_decisions_total{class="auth",scope="endpoint_user",outcome="limited"} 0"#,
        r#"palisade_limit_decisions_total{class="read",scope="ip",outcome="allowed"} 0"#,
        r#"palisade_fail_open_total{class="payment",outcome="fail_closed"} 0"#,
        r#"palisade_alerts_total{kind="spraying"} 0"#,
        r#"palisade_grpc_requests_total{outcome="over_limit"} 0"#,
        r#"palisade_hot_rebuilds_total{outcome="failed"} 0"#,
        "palisade_limit_l1_hits_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("palisade_build_info{version=\"") && l.ends_with("} 1")),
        "{text}"
    );
    for name in ["process_cpu_seconds_total", "process_resident_memory_bytes"] {
        assert!(text.lines().any(|l| l.starts_with(name)), "{name}\n{text}");
    }
}

/// `/docs`: the interactive API reference, every asset from the binary (no CDN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reference_page_is_served_without_a_cdn() {
    let app = crate::helpers::TestApp::spawn(crate::helpers::Backend::Embedded)
        .await
        .unwrap();
    let page = app.get("/docs", None).await;
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = page.text().await.unwrap();
    assert!(html.contains("/docs/redoc.js") && html.contains("/openapi.json"));
    assert!(
        !html.contains("https://") && !html.contains("http://"),
        "{html}"
    );
    // The script, gzip-encoded as shipped; decoded, it is Redoc.
    let raw = reqwest::Client::builder()
        .no_gzip()
        .build()
        .unwrap()
        .get(app.url("/docs/redoc.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), reqwest::StatusCode::OK);
    assert_eq!(raw.headers()["content-encoding"], "gzip");
    let bytes = raw.bytes().await.unwrap();
    let mut script = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut script)
        .unwrap();
    assert!(
        script.len() > 500_000 && script.contains("Redoc"),
        "{}",
        script.len()
    );
}
