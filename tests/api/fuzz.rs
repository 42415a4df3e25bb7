//! Arbitrary bytes to every JSON endpoint never give a 5xx (DESIGN.md: no input, however
//! malformed, may produce a 500).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp};

/// POST routes with JSON bodies; each new area adds its own.
const JSON_ROUTES: &[&str] = &[
    "/v1/admin/tokens",
    "/v1/limit/check",
    "/v1/events/auth",
    "/v1/lockouts/01ARZ3NDEKTSV4RRFFQ69G5FAV/release",
    "/v1/lists/deny",
    "/v1/lists/allow",
];

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
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(
                proptest::sample::select(JSON_ROUTES),
                body_strategy(),
                any::<bool>(),
            ),
            |(route, body, json_type)| {
                let status = runtime.block_on(async {
                    let mut request = app
                        .client
                        .post(app.url(route))
                        .bearer_auth(ADMIN_TOKEN)
                        .body(body.clone());
                    if json_type {
                        request = request.header("content-type", "application/json");
                    }
                    request.send().await.unwrap().status()
                });
                prop_assert!(
                    !status.is_server_error(),
                    "{route} answered {status} to {:?}",
                    String::from_utf8_lossy(&body)
                );
                Ok(())
            },
        )
        .unwrap();
}
