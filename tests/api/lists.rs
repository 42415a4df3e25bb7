//! Manual allow/deny lists: stored, audited, enforced by the limiter and reputation.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, assert_envelope};
use crate::on_both_backends;

on_both_backends!(
    denied_account_is_blocked_until_the_entry_is_deleted,
    denied_ip_is_blocked_and_shown_in_reputation,
    allow_wins_over_range_classes_and_deny_over_allow,
    denied_asn_covers_its_addresses,
    entries_are_validated_and_kinds_inferred,
    expired_entries_stop_applying,
    lists_need_the_analyst_role,
);

async fn add(app: &TestApp, list: &str, body: Value) -> Value {
    let response = app
        .post(&format!("/v1/lists/{list}"), Some(ADMIN_TOKEN), &body)
        .await;
    assert_eq!(response.status(), StatusCode::CREATED, "{body}");
    response.json().await.unwrap()
}

async fn reputation(app: &TestApp, ip: &str) -> Value {
    app.get(&format!("/v1/reputation/{ip}"), Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap()
}

async fn denied_account_is_blocked_until_the_entry_is_deleted(app: TestApp) {
    let second = app.another_instance().await;
    let entry = add(
        &app,
        "deny",
        json!({"value": "mallory", "kind": "account", "reason": "fraud ring"}),
    )
    .await;
    assert_eq!(entry["kind"], "account");
    let read = json!({"endpoint": "/v1/feed", "ip": "192.0.2.1", "user_id": "mallory"});
    // Enforced on every instance sharing the stores (embedded: the one process).
    let other = if app.backend == Backend::Production {
        &second
    } else {
        &app
    };
    assert_envelope(
        other.limit_check(&read).await,
        StatusCode::TOO_MANY_REQUESTS,
        "RATE_LIMITED",
    )
    .await;
    let listed: Value = app
        .get("/v1/lists/deny", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["items"][0]["value"], "mallory");
    let id = entry["id"].as_str().unwrap();
    let deleted = app
        .request(
            Method::DELETE,
            &format!("/v1/lists/deny/{id}?reason=resolved"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(deleted.status(), StatusCode::OK);
    // Another instance may still hold the block in its L1 cache for one L1 TTL.
    if app.backend == Backend::Production {
        tokio::time::sleep(Duration::from_millis(app.settings.limits.l1_ttl_ms + 50)).await;
    }
    assert_eq!(other.limit_check(&read).await.status(), StatusCode::OK);
    let again = app
        .request(
            Method::DELETE,
            &format!("/v1/lists/deny/{id}?reason=resolved"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(again, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    let audit: Value = app
        .get("/v1/audit", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(&actions[..2], &["list.delete", "list.add"]);
}

async fn denied_ip_is_blocked_and_shown_in_reputation(app: TestApp) {
    let entry = add(
        &app,
        "deny",
        json!({"value": "::ffff:203.0.113.50", "reason": "scanner"}),
    )
    .await;
    assert_eq!(
        (entry["kind"].as_str(), entry["value"].as_str()),
        (Some("cidr"), Some("203.0.113.50/32"))
    );
    let check = app
        .limit_check(&json!({"endpoint": "/v1/feed", "ip": "203.0.113.50"}))
        .await;
    assert_envelope(check, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    let verdict = reputation(&app, "203.0.113.50").await;
    assert_eq!(verdict["classes"], json!(["deny"]));
    assert_eq!(verdict["multiplier"], 0.0);
    assert_eq!(reputation(&app, "203.0.113.51").await["multiplier"], 1.0);
}

async fn allow_wins_over_range_classes_and_deny_over_allow(app: TestApp) {
    app.load_data(&[(
        "data/ranges/tor/tor-exit-relays.csv.gz",
        "ranges/tor/exits.csv",
    )])
    .await;
    assert_eq!(reputation(&app, "204.8.96.141").await["multiplier"], 0.25);
    add(
        &app,
        "allow",
        json!({"value": "204.8.96.0/24", "reason": "our own relay"}),
    )
    .await;
    let verdict = reputation(&app, "204.8.96.141").await;
    assert_eq!(verdict["classes"], json!(["allow", "tor"]));
    assert_eq!(verdict["multiplier"], 1.0);
    add(
        &app,
        "deny",
        json!({"value": "204.8.96.141", "reason": "abused"}),
    )
    .await;
    assert_eq!(reputation(&app, "204.8.96.141").await["multiplier"], 0.0);
}

async fn denied_asn_covers_its_addresses(app: TestApp) {
    app.load_data(&[(
        "tests/fixtures/mmdb/GeoLite2-ASN-Test.mmdb",
        "asn/test.mmdb",
    )])
    .await;
    let entry = add(&app, "deny", json!({"value": "as1221", "reason": "test"})).await;
    assert_eq!(
        (entry["kind"].as_str(), entry["value"].as_str()),
        (Some("asn"), Some("AS1221"))
    );
    let verdict = reputation(&app, "1.128.0.1").await;
    assert_eq!(verdict["asn"], 1221);
    assert_eq!(verdict["classes"], json!(["deny"]));
}

async fn entries_are_validated_and_kinds_inferred(app: TestApp) {
    for body in [
        json!({"value": "alice", "reason": "no kind"}),
        json!({"value": "10.0.0.0/33", "kind": "cidr", "reason": "bad"}),
        json!({"value": "192.0.2.1", "reason": ""}),
        json!({"value": "192.0.2.1", "reason": "x", "expires_at": "2000-01-01T00:00:00Z"}),
        json!({"value": "192.0.2.1", "reason": "x", "expires_at": "soon"}),
        json!({"value": "ASxyz", "kind": "asn", "reason": "x"}),
        json!({"value": "192.0.2.1", "kind": "planet", "reason": "x"}),
    ] {
        let response = app.post("/v1/lists/deny", Some(ADMIN_TOKEN), &body).await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    let grey = app
        .post(
            "/v1/lists/grey",
            Some(ADMIN_TOKEN),
            &json!({"value": "192.0.2.1", "reason": "x"}),
        )
        .await;
    assert_envelope(grey, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let device = add(
        &app,
        "allow",
        json!({"value": "trusted-phone", "kind": "device", "reason": "QA device"}),
    )
    .await;
    assert_eq!(device["kind"], "device");
}

async fn expired_entries_stop_applying(app: TestApp) {
    let soon = chrono::DateTime::from_timestamp_millis(app.app.clock.now_ms() + 1000)
        .unwrap()
        .to_rfc3339();
    add(
        &app,
        "deny",
        json!({"value": "198.51.100.77", "reason": "temporary", "expires_at": soon}),
    )
    .await;
    assert_eq!(reputation(&app, "198.51.100.77").await["multiplier"], 0.0);
    app.advance(Duration::from_millis(1100)).await;
    assert_eq!(reputation(&app, "198.51.100.77").await["multiplier"], 1.0);
    let listed: Value = app
        .get("/v1/lists/deny", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert!(listed["items"].as_array().unwrap().is_empty());
}

async fn lists_need_the_analyst_role(app: TestApp) {
    let (_, limiter) = app.create_token("limiter", "gw").await;
    let response = app
        .post(
            "/v1/lists/deny",
            Some(&limiter),
            &json!({"value": "192.0.2.1", "reason": "x"}),
        )
        .await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    assert_envelope(
        app.get("/v1/lists/allow", Some(&limiter)).await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
}

/// An entry added on one instance reaches another's reputation answers on the next refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn another_instance_picks_up_list_changes() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let second = app.another_instance().await;
    add(
        &app,
        "deny",
        json!({"value": "198.51.100.0/24", "reason": "botnet"}),
    )
    .await;
    assert_eq!(
        reputation(&second, "198.51.100.9").await["multiplier"],
        1.0,
        "not refreshed yet"
    );
    second.app.lists.refresh_if_changed().await.unwrap();
    assert_eq!(reputation(&second, "198.51.100.9").await["multiplier"], 0.0);
}
