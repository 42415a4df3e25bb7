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
    an_analyst_cannot_deny_the_whole_internet,
    free_text_refuses_bidi_and_invisible_characters,
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
    let (admin_id, admin) = app.create_token("admin", "first-operator").await;
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
    // The retirement is durable: with that admin token revoked, a restarted instance still
    // refuses the bootstrap token, and says why.
    let revoked = app
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/admin/tokens/{admin_id}?reason=rotation"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(revoked.status(), StatusCode::OK);
    let restarted = app.another_instance().await;
    let refused = assert_envelope(
        restarted.get("/v1/audit", Some(ADMIN_TOKEN)).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("retired when the first admin token was made"),
        "{message}"
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

/// A deny entry wider than /8 (/16) refuses a large part of the internet: refused unless
/// forced, the force an admin's only (audited), and such a range is enforced but never
/// handed to CrowdSec bouncers or edge exports, where a firewall would drop everyone.
async fn an_analyst_cannot_deny_the_whole_internet(app: TestApp) {
    let (_, analyst) = app.create_token("analyst", "soc").await;
    for cidr in ["0.0.0.0/0", "10.0.0.0/7", "::/0", "2001::/15"] {
        let refused = app
            .post(
                "/v1/lists/deny",
                Some(&analyst),
                &json!({"value": cidr, "reason": "block everyone"}),
            )
            .await;
        let body = assert_envelope(refused, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        assert!(
            body["error"]["message"].as_str().unwrap().contains("force"),
            "{body}"
        );
        let forced = app
            .post(
                "/v1/lists/deny",
                Some(&analyst),
                &json!({"value": cidr, "reason": "block everyone", "force": true}),
            )
            .await;
        assert_envelope(forced, StatusCode::FORBIDDEN, "FORBIDDEN").await;
        for list in ["allow", "deny"] {
            let forced = app
                .post(
                    &format!("/v1/lists/{list}"),
                    Some(&analyst),
                    &json!({"value": cidr, "reason": "x", "force": true}),
                )
                .await;
            assert_envelope(forced, StatusCode::FORBIDDEN, "FORBIDDEN").await;
        }
    }
    let narrow = app
        .post(
            "/v1/lists/deny",
            Some(&analyst),
            &json!({"value": "198.51.100.0/24", "reason": "a scanner's range"}),
        )
        .await;
    assert_eq!(narrow.status(), StatusCode::CREATED);
    let forced = app
        .post(
            "/v1/lists/deny",
            Some(ADMIN_TOKEN),
            &json!({"value": "0.0.0.0/0", "reason": "maintenance", "force": true}),
        )
        .await;
    assert_eq!(forced.status(), StatusCode::CREATED);
    let added = audit_actions(&app, "list.add").await;
    assert_eq!(added[0]["details"]["forced"], true, "{added:?}");
    // Enforced by Palisade itself…
    let check = app
        .limit_check(&json!({"endpoint": "/v1/feed", "method": "GET", "ip": "203.0.113.5"}))
        .await;
    assert_eq!(check.status(), StatusCode::TOO_MANY_REQUESTS);
    // …but a bouncer pulling every ban gets only the narrow one.
    let (_, bouncer) = app.create_token("limiter", "bouncer").await;
    let stream: Value = app
        .client
        .get(app.url("/crowdsec/v1/decisions/stream?startup=true"))
        .header("X-Api-Key", &bouncer)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let values: Vec<&str> = stream["new"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["198.51.100.0/24"], "{stream}");
    let live = app
        .client
        .get(app.url("/crowdsec/v1/decisions?ip=203.0.113.5"))
        .header("X-Api-Key", &bouncer)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(live, "null");
    // Edge exports leave it out and say so.
    let vcl = app
        .get("/v1/export/fastly", Some(ADMIN_TOKEN))
        .await
        .text()
        .await
        .unwrap();
    assert!(vcl.contains("\"198.51.100.0\"/24"), "{vcl}");
    assert!(!vcl.contains("\"0.0.0.0\"/0"), "{vcl}");
    assert!(vcl.contains("never exported"), "{vcl}");
}

/// Reasons and token names are read by people in the console, the audit log and exported
/// files: a bidi control (U+202E reverses what follows) or a zero-width character would
/// make them say something else; a line break would forge a line. Refused everywhere.
async fn free_text_refuses_bidi_and_invisible_characters(app: TestApp) {
    let bad = [
        "ok \u{202e}txt.exe",
        "ok \u{2066}hidden\u{2069}",
        "ok\u{200b}",
        "line\rbreak",
        "line\nbreak",
    ];
    for text in bad {
        let entry = app
            .post(
                "/v1/lists/deny",
                Some(ADMIN_TOKEN),
                &json!({"value": "192.0.2.9", "reason": text}),
            )
            .await;
        assert_envelope(entry, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        let token = app
            .post(
                "/v1/admin/tokens",
                Some(ADMIN_TOKEN),
                &json!({"role": "analyst", "name": text, "reason": "x"}),
            )
            .await;
        assert_envelope(token, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        let token = app
            .post(
                "/v1/admin/tokens",
                Some(ADMIN_TOKEN),
                &json!({"role": "analyst", "name": "fine", "reason": text}),
            )
            .await;
        assert_envelope(token, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    // Other scripts and emoji without joiners are fine.
    let entry = app
        .post(
            "/v1/lists/deny",
            Some(ADMIN_TOKEN),
            &json!({"value": "192.0.2.9", "reason": "\u{30b9}\u{30ad}\u{30e3}\u{30ca}\u{30fc} \u{1f6a8}"}),
        )
        .await;
    assert_eq!(entry.status(), StatusCode::CREATED);
}
