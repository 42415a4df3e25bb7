//! Arbitrary bytes to every JSON endpoint never give a 5xx (DESIGN.md: no input, however
//! malformed, may produce a 500).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp};

/// A value for each path parameter the API names.
const PATH_VALUES: &[(&str, &str)] = &[
    ("{account}", "alice"),
    ("{id}", "01ARZ3NDEKTSV4RRFFQ69G5FAV"),
    ("{ip}", "192.0.2.1"),
    ("{list}", "deny"),
    ("{provider}", "cloudflare"),
    ("{device_id}", "device-1"),
];

/// Every operation of the OpenAPI document that takes a body (POST, PUT, PATCH), its path
/// parameters filled in: a new route is fuzzed as soon as it is documented.
async fn body_routes(app: &TestApp) -> Vec<(reqwest::Method, String)> {
    let doc: serde_json::Value = app.get("/openapi.json", None).await.json().await.unwrap();
    let mut routes = Vec::new();
    for (path, operations) in doc["paths"].as_object().expect("paths") {
        for method in operations.as_object().expect("operations").keys() {
            let method = match method.as_str() {
                "post" => reqwest::Method::POST,
                "put" => reqwest::Method::PUT,
                "patch" => reqwest::Method::PATCH,
                _ => continue,
            };
            let mut filled = path.clone();
            for (name, value) in PATH_VALUES {
                filled = filled.replace(name, value);
            }
            assert!(
                !filled.contains('{'),
                "{path}: a path parameter without a value in PATH_VALUES"
            );
            routes.push((method, filled));
        }
    }
    routes.sort_by(|a, b| a.1.cmp(&b.1));
    routes
}

fn body_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        // Near-JSON: structurally plausible documents with odd values.
        "\\{(\"[a-z_]{1,8}\":(-?[0-9]{1,20}|\"[^\"]{0,40}\"|null|true|\\[\\]|\\{\\}),?){0,6}\\}"
            .prop_map(String::into_bytes),
    ]
}

#[test]
fn arbitrary_bytes_to_json_endpoints_never_give_a_5xx() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = runtime.block_on(TestApp::spawn(Backend::Embedded)).unwrap();
    let routes = runtime.block_on(body_routes(&app));
    for known in [
        "/v1/limit/check",
        "/v1/events/auth",
        "/v1/events/messaging",
        "/v1/lists/deny",
        "/v1/admin/tokens",
        "/v1/policy/candidates",
        "/v1/attestations",
    ] {
        assert!(
            routes.iter().any(|(_, path)| path == known),
            "{known} is missing from {routes:?}"
        );
    }
    let mut runner = TestRunner::new(Config {
        // About twenty bodies for each route.
        cases: 20 * routes.len() as u32,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(
                proptest::sample::select(routes),
                body_strategy(),
                any::<bool>(),
            ),
            |((method, route), body, json_type)| {
                let status = runtime.block_on(async {
                    let mut request = app
                        .client
                        .request(method.clone(), app.url(&route))
                        .bearer_auth(ADMIN_TOKEN)
                        .body(body.clone());
                    if json_type {
                        request = request.header("content-type", "application/json");
                    }
                    request.send().await.unwrap().status()
                });
                prop_assert!(
                    !status.is_server_error(),
                    "{method} {route} answered {status} to {:?}",
                    String::from_utf8_lossy(&body)
                );
                Ok(())
            },
        )
        .unwrap();
}

/// Every cursor and id query parameter, on both backends: forged values (overflowing stream
/// ids, signs, spaces, huge numbers, random text) are a 400 or an empty page, never a 5xx.
#[test]
fn forged_cursors_are_refused_never_a_5xx() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let routes: Vec<&'static str> = vec![
        "/v1/decisions?since=",
        "/v1/lockouts?cursor=",
        "/v1/lockouts?since=",
        "/v1/audit?cursor=",
        "/v1/alerts?cursor=",
        "/v1/alerts?since=",
        "/v1/lockouts/",
        "/v1/offenders?window_s=",
        "/v1/decisions?limit=",
    ];
    let cursor = prop_oneof![
        Just("18446744073709551616-0".to_owned()),
        Just("0-18446744073709551616".to_owned()),
        Just("99999999999999999999999999".to_owned()),
        Just("-1".to_owned()),
        Just("1-".to_owned()),
        Just("+5-0".to_owned()),
        Just("7ZZZZZZZZZZZZZZZZZZZZZZZZZ".to_owned()),
        Just("8ZZZZZZZZZZZZZZZZZZZZZZZZZ".to_owned()),
        "[0-9]{1,25}(-[0-9]{0,25})?",
        "[0-9A-Z]{26}",
        "[ -~]{0,40}",
    ];
    for backend in [Backend::Embedded, Backend::Production] {
        let Some(app) = runtime.block_on(TestApp::spawn(backend)) else {
            continue;
        };
        // The known forgeries on every route first, then generated ones.
        let forged = [
            "18446744073709551616-0",
            "0-18446744073709551616",
            "99999999999999999999999999",
            "-1",
            "+5-0",
            "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
        ];
        for route in &routes {
            for value in forged {
                let status = runtime.block_on(async {
                    app.client
                        .get(format!("{}{route}{}", app.base, utf8_percent_encode(value)))
                        .bearer_auth(ADMIN_TOKEN)
                        .send()
                        .await
                        .unwrap()
                        .status()
                });
                assert!(
                    !status.is_server_error(),
                    "{backend:?} {route}{value:?} answered {status}"
                );
            }
        }
        let mut runner = TestRunner::new(Config {
            cases: 150,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(
                &(proptest::sample::select(routes.clone()), cursor.clone()),
                |(route, value)| {
                    let status = runtime.block_on(async {
                        let url = format!("{}{route}{}", app.base, utf8_percent_encode(&value));
                        app.client
                            .get(url)
                            .bearer_auth(ADMIN_TOKEN)
                            .send()
                            .await
                            .unwrap()
                            .status()
                    });
                    prop_assert!(
                        !status.is_server_error(),
                        "{backend:?} {route}{value:?} answered {status}"
                    );
                    Ok(())
                },
            )
            .unwrap();
    }
}

/// Percent-encodes everything but unreserved characters (a query value or path segment).
fn utf8_percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
