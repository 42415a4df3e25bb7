//! Writes that grant trust leave a record (wide allow entries refused unless forced, forced
//! ones, foreign login successes and rejected reloads audited), and the bootstrap token
//! retires once an admin token exists; on both backends.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, assert_envelope};
use crate::on_both_backends;

on_both_backends!(
    writes_that_grant_trust_are_refused_or_audited,
    the_bootstrap_token_retires_once_an_admin_token_exists,
);

async fn audit_actions(app: &TestApp, action: &str) -> Vec<Value> {
    let page: Value = app
        .get(&format!("/v1/audit?action={action}"), Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    page["items"].as_array().unwrap().clone()
}

/// Writes that grant trust leave a record: an allow entry wider than /8 (`0.0.0.0/0` would
/// lift every reputation penalty on the internet) is refused unless forced, and the force
/// is audited; login successes posted with a token that is not the auth service's are
/// audited; a rejected reload is audited.
async fn writes_that_grant_trust_are_refused_or_audited(app: TestApp) {
    for cidr in ["0.0.0.0/0", "10.0.0.0/7", "::/0", "2001::/15"] {
        let refused = app
            .post(
                "/v1/lists/allow",
                Some(ADMIN_TOKEN),
                &json!({"value": cidr, "reason": "everyone is welcome"}),
            )
            .await;
        let body = assert_envelope(refused, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        assert!(
            body["error"]["message"].as_str().unwrap().contains("force"),
            "{body}"
        );
    }
    let narrow = app
        .post(
            "/v1/lists/allow",
            Some(ADMIN_TOKEN),
            &json!({"value": "10.0.0.0/8", "reason": "the office"}),
        )
        .await;
    assert_eq!(narrow.status(), StatusCode::CREATED);
    let forced = app
        .post(
            "/v1/lists/allow",
            Some(ADMIN_TOKEN),
            &json!({"value": "0.0.0.0/0", "reason": "load test", "force": true}),
        )
        .await;
    assert_eq!(forced.status(), StatusCode::CREATED);
    let added = audit_actions(&app, "list.add").await;
    assert_eq!(added[0]["details"]["forced"], true, "{added:?}");
    assert_eq!(added[1]["details"]["forced"], false, "{added:?}");
    // A login success from the admin token: stored, and audited.
    let success = app
        .post(
            "/v1/events/auth",
            Some(ADMIN_TOKEN),
            &json!({"events": [{"event_id": "adm-1", "type": "login_success",
                                "account": "Someone", "ip": "198.51.100.5"}]}),
        )
        .await;
    assert_eq!(success.status(), StatusCode::OK);
    let audited = audit_actions(&app, "auth_event.success").await;
    assert_eq!(audited.len(), 1);
    assert_eq!(audited[0]["target"], "someone");
    assert_eq!(audited[0]["details"]["count"], 1);
    // The auth service's own token is not audited for it.
    let (_, ingest) = app.create_token("ingest", "auth-service").await;
    let success = app
        .post(
            "/v1/events/auth",
            Some(&ingest),
            &json!({"events": [{"event_id": "ing-1", "type": "login_success",
                                "account": "someone", "ip": "198.51.100.5"}]}),
        )
        .await;
    assert_eq!(success.status(), StatusCode::OK);
    assert_eq!(audit_actions(&app, "auth_event.success").await.len(), 1);
    // A broken data file: the reload is rejected and audited.
    let broken = app.settings.data_dir.join("ranges/tor");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("broken.txt"), "not-an-address\n").unwrap();
    let reload = app
        .post("/v1/admin/reload", Some(ADMIN_TOKEN), &json!({}))
        .await;
    assert_envelope(reload, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let rejected = audit_actions(&app, "reputation.reload_rejected").await;
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0]["details"]["file"], "ranges/tor/broken.txt");
}

/// The bootstrap token is for the first start: once an admin token exists it is refused, at
/// once on the instance that made the token and after a refresh on the others; a configured
/// expiry ends it too.
async fn the_bootstrap_token_retires_once_an_admin_token_exists(app: TestApp) {
    let other = app.another_instance().await;
    assert_eq!(
        other.get("/v1/audit", Some(ADMIN_TOKEN)).await.status(),
        StatusCode::OK
    );
    let (_, admin) = app.create_token("admin", "first-operator").await;
    assert_envelope(
        app.get("/v1/audit", Some(ADMIN_TOKEN)).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    // The other instance learns it on its next refresh (every second in the background).
    other.app.access.refresh_bootstrap().await.unwrap();
    assert_envelope(
        other.get("/v1/audit", Some(ADMIN_TOKEN)).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    assert_eq!(
        other.get("/v1/audit", Some(&admin)).await.status(),
        StatusCode::OK
    );
    // Expired by the setting.
    let expired = TestApp::spawn_with(app.backend, |settings| {
        settings.bootstrap_token_expires_at = Some("2020-01-01T00:00:00Z".to_owned());
    })
    .await
    .unwrap();
    assert_envelope(
        expired.get("/v1/audit", Some(ADMIN_TOKEN)).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
}
