//! Every way a refusal says "when" names the same instant or a later one: `Retry-After`,
//! the deciding budget's `RateLimit` `t`, `X-RateLimit-Reset` and the body's `reset` and
//! `retry_after_ms`, for every refusal reason a test can bring about, through the JSON check
//! and forward-auth alike. A client that trusts any one of them never retries early (a
//! locked account once said `Retry-After: 897` beside `t=9`).

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp};
use crate::on_both_backends;

on_both_backends!(every_refusal_says_when_one_way);

/// The deciding budget's `t` in a `RateLimit` header (`"name";r=0;t=9, …`).
fn rate_limit_t(headers: &HeaderMap, budget: &str) -> u64 {
    let value = headers["ratelimit"].to_str().unwrap();
    value
        .split(", ")
        .find(|item| item.starts_with(&format!("\"{budget}\";")))
        .and_then(|item| item.split(";t=").nth(1))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no t for {budget} in {value}"))
}

/// Checks one refusal's headers and body against each other; returns its reason.
async fn consistent(response: reqwest::Response, what: &str) -> String {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
    let headers = response.headers().clone();
    let body: Value = response.json().await.unwrap();
    let details = &body["error"]["details"];
    let budget = details["budget"].as_str().unwrap();
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    let retry_after_ms = details["retry_after_ms"].as_u64().unwrap();
    let t = rate_limit_t(&headers, budget);
    let reset: i64 = headers["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        retry_after,
        retry_after_ms.div_ceil(1000).max(1),
        "{what}: {body}"
    );
    assert!(
        t >= retry_after_ms.div_ceil(1000),
        "{what}: RateLimit t={t} is before Retry-After {retry_after} ({body})"
    );
    assert_eq!(details["reset"].as_i64(), Some(reset), "{what}: {body}");
    details["reason"].as_str().unwrap().to_owned()
}

async fn every_refusal_says_when_one_way(app: TestApp) {
    let check = |endpoint: &str, ip: &str, user: Option<&str>, device: Option<&str>| {
        let mut body = json!({"endpoint": endpoint, "method": "POST", "ip": ip});
        if let Some(user) = user {
            body["user_id"] = json!(user);
        }
        if let Some(device) = device {
            body["device_id"] = json!(device);
        }
        body
    };
    let mut reasons = Vec::new();
    // account_rate: the account's 5 logins a minute.
    for _ in 0..5 {
        app.limit_check(&check("/auth/login", "198.51.100.10", Some("carol"), None))
            .await;
    }
    let refused = app
        .limit_check(&check("/auth/login", "198.51.100.10", Some("carol"), None))
        .await;
    reasons.push(consistent(refused, "account rate").await);
    // ip_rate: 10 unauthenticated logins a minute per address.
    for _ in 0..10 {
        app.limit_check(&check("/auth/login", "198.51.100.11", None, None))
            .await;
    }
    let refused = app
        .limit_check(&check("/auth/login", "198.51.100.11", None, None))
        .await;
    reasons.push(consistent(refused, "ip rate").await);
    // account_locked: ten failures lock dave for minutes; a stranger is refused until then.
    let events: Vec<Value> = (0..10)
        .map(|i| {
            json!({"event_id": format!("when-{i}"), "type": "login_failure",
                        "account": "dave", "ip": format!("203.0.113.{}", 20 + i)})
        })
        .collect();
    let posted = app
        .post(
            "/v1/events/auth",
            Some(ADMIN_TOKEN),
            &json!({ "events": events }),
        )
        .await;
    assert_eq!(posted.status(), StatusCode::OK);
    let refused = app
        .limit_check(&check("/auth/login", "198.51.100.12", Some("dave"), None))
        .await;
    let reason = consistent(refused, "account locked").await;
    assert_eq!(reason, "account_locked");
    reasons.push(reason);
    // The same refusal through forward-auth carries the same headers.
    let through_gateway = app
        .client
        .get(app.url("/v1/forward-auth"))
        .bearer_auth(ADMIN_TOKEN)
        .header("x-forwarded-method", "POST")
        .header("x-forwarded-uri", "/auth/login")
        .header("x-forwarded-for", "198.51.100.13")
        .header("x-user-id", "dave")
        .send()
        .await
        .unwrap();
    reasons.push(consistent(through_gateway, "account locked, forward-auth").await);
    // ip_blocked and device_blocked: deny entries.
    for (value, kind) in [("192.0.2.200", "cidr"), ("stolen-phone", "device")] {
        let added = app
            .post(
                "/v1/lists/deny",
                Some(ADMIN_TOKEN),
                &json!({"value": value, "kind": kind, "reason": "abuse"}),
            )
            .await;
        assert_eq!(added.status(), StatusCode::CREATED);
    }
    let refused = app
        .limit_check(&check("/v1/feed", "192.0.2.200", None, None))
        .await;
    reasons.push(consistent(refused, "ip denied").await);
    let refused = app
        .limit_check(&check(
            "/v1/feed",
            "198.51.100.14",
            None,
            Some("stolen-phone"),
        ))
        .await;
    reasons.push(consistent(refused, "device denied").await);
    reasons.sort();
    reasons.dedup();
    assert!(
        reasons.len() >= 5,
        "every kind of refusal was tried: {reasons:?}"
    );
}
