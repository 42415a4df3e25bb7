//! Edge export: the budgets and deny entries a CDN can enforce, in Cloudflare's, AWS WAF's
//! and Fastly's own formats, checked against each format's documented constraints, with what
//! the edge cannot express listed (never silently dropped).

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, assert_envelope};
use crate::on_both_backends;

on_both_backends!(edge_rules_are_exported_for_each_provider);

async fn deny(app: &TestApp, value: &str, reason: &str) {
    let body = match value.strip_prefix("user:") {
        Some(account) => json!({"kind": "account", "value": account, "reason": reason}),
        None => json!({"value": value, "reason": reason}),
    };
    let response = app.post("/v1/lists/deny", Some(ADMIN_TOKEN), &body).await;
    assert_eq!(response.status(), StatusCode::CREATED, "{value}");
}

async fn export(app: &TestApp, provider: &str) -> reqwest::Response {
    app.get(&format!("/v1/export/{provider}"), Some(ADMIN_TOKEN))
        .await
}

fn mentions(notes: &Value, text: &str) -> bool {
    notes
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap().contains(text))
}

async fn edge_rules_are_exported_for_each_provider(app: TestApp) {
    deny(&app, "203.0.113.0/24", "credential stuffing").await;
    deny(&app, "2001:db8:66::/48", "abusive hosting").await;
    deny(&app, "AS64500", "bulletproof hosting").await;
    deny(&app, "user:mallory", "fraud").await;

    // Cloudflare: rate limiting rules on periods Cloudflare counts over, characteristics
    // that include the colo (required), an IP list and the rules that use it.
    let response = export(&app, "cloudflare").await;
    assert_eq!(response.status(), StatusCode::OK);
    let cf: Value = response.json().await.unwrap();
    let rules = cf["rate_limiting_rules"]["rules"].as_array().unwrap();
    let auth = rules
        .iter()
        .find(|r| r["description"].as_str().unwrap().contains("auth-ip"))
        .expect("the auth class's per-IP budget");
    assert_eq!(auth["ratelimit"]["requests_per_period"], 10);
    assert_eq!(auth["ratelimit"]["period"], 60);
    let expression = auth["expression"].as_str().unwrap();
    assert!(
        expression.contains(r#"starts_with(lower(http.request.uri.path), "/auth/")"#)
            && expression.contains(r#"lower(http.request.uri.path) eq "/login""#),
        "{expression}"
    );
    for rule in rules {
        let period = rule["ratelimit"]["period"].as_u64().unwrap();
        assert!([10, 60, 120, 300, 600, 3600].contains(&period), "{rule}");
        let characteristics = rule["ratelimit"]["characteristics"].as_array().unwrap();
        assert!(characteristics.contains(&json!("cf.colo.id")));
        assert_eq!(rule["action"], "block");
        // Balanced parentheses and quotes.
        let e = rule["expression"].as_str().unwrap();
        assert_eq!(e.matches('(').count(), e.matches(')').count(), "{e}");
        assert_eq!(e.matches('"').count() % 2, 0, "{e}");
    }
    let items = cf["lists"][0]["items"].as_array().unwrap();
    assert!(items.contains(&json!({"ip": "203.0.113.0/24", "comment": "credential stuffing"})));
    assert_eq!(cf["lists"][0]["kind"], "ip");
    let custom = cf["custom_rules"]["rules"].to_string();
    assert!(
        custom.contains("ip.src in $palisade_deny") && custom.contains("ip.src.asnum in {64500}"),
        "{custom}"
    );
    let notes = &cf["not_expressed"];
    assert!(
        mentions(notes, "budget auth-account: keyed by endpoint_user"),
        "{notes}"
    );
    assert!(
        mentions(notes, "budget ip-authn: counts only signed-in"),
        "{notes}"
    );
    assert!(
        mentions(notes, "(Account): the edge does not know accounts"),
        "{notes}"
    );
    assert!(mentions(notes, "multipliers"), "{notes}");

    // AWS WAF: rate-based rules within its windows and its minimum limit, scope-down
    // statements built as AWS nests them, IP sets per address family.
    let response = export(&app, "aws-waf").await;
    assert_eq!(response.status(), StatusCode::OK);
    let aws: Value = response.json().await.unwrap();
    let rules = aws["rules"].as_array().unwrap();
    let auth = rules
        .iter()
        .find(|r| r["Name"] == "palisade-auth-ip")
        .unwrap();
    let rate = &auth["Statement"]["RateBasedStatement"];
    assert_eq!(
        (rate["Limit"].as_u64(), rate["EvaluationWindowSec"].as_u64()),
        (Some(10), Some(60))
    );
    assert_eq!(rate["AggregateKeyType"], "IP");
    let scope = rate["ScopeDownStatement"].to_string();
    assert!(
        scope.contains(r#""PositionalConstraint":"STARTS_WITH""#)
            && scope.contains(r#""SearchString":"/auth/""#),
        "{scope}"
    );
    let mut priorities = Vec::new();
    for rule in rules {
        priorities.push(rule["Priority"].as_u64().unwrap());
        assert_eq!(rule["Action"], json!({"Block": {}}));
        assert!(rule["VisibilityConfig"]["MetricName"].is_string());
        if let Some(rate) = rule["Statement"].get("RateBasedStatement") {
            assert!(rate["Limit"].as_u64().unwrap() >= 10, "{rule}");
            assert!([60, 120, 300, 600].contains(&rate["EvaluationWindowSec"].as_u64().unwrap()));
        }
        // Or/And statements always combine at least two.
        for kind in ["OrStatement", "AndStatement"] {
            let text = rule.to_string();
            if text.contains(kind) {
                fn check(value: &Value, kind: &str) {
                    match value {
                        Value::Object(map) => {
                            if let Some(inner) = map.get(kind) {
                                assert!(inner["Statements"].as_array().unwrap().len() >= 2);
                            }
                            map.values().for_each(|v| check(v, kind));
                        }
                        Value::Array(items) => items.iter().for_each(|v| check(v, kind)),
                        _ => {}
                    }
                }
                check(rule, kind);
            }
        }
    }
    let mut unique = priorities.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), priorities.len(), "priorities are unique");
    let sets = aws["ip_sets"].as_array().unwrap();
    let v4 = sets
        .iter()
        .find(|s| s["IPAddressVersion"] == "IPV4")
        .unwrap();
    assert_eq!(v4["Addresses"], json!(["203.0.113.0/24"]));
    let v6 = sets
        .iter()
        .find(|s| s["IPAddressVersion"] == "IPV6")
        .unwrap();
    assert_eq!(v6["Addresses"], json!(["2001:db8:66::/48"]));
    assert!(
        rules
            .iter()
            .any(|r| r["Statement"]["AsnMatchStatement"]["AsnList"] == json!([64500]))
    );

    // Fastly: an ACL of the deny entries and VCL that uses it; budgets below one request a
    // second are listed, not approximated.
    let response = export(&app, "fastly").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let vcl = response.text().await.unwrap();
    assert!(
        vcl.contains("acl palisade_deny {") && vcl.contains("\"203.0.113.0\"/24;"),
        "{vcl}"
    );
    assert!(
        vcl.contains("if (client.ip ~ palisade_deny)") && vcl.contains("client.as.number == 64500"),
        "{vcl}"
    );
    assert!(
        vcl.contains(
            "#   budget auth-ip: 10 per 60 s is not a whole number of requests per second"
        ),
        "{vcl}"
    );
    assert_eq!(vcl.matches('{').count(), vcl.matches('}').count(), "{vcl}");

    assert_envelope(
        export(&app, "akamai").await,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
    )
    .await;
    let analyst = app.create_token("analyst", "ana").await.1;
    let response = app.get("/v1/export/cloudflare", Some(&analyst)).await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
}
