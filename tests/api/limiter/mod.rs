//! Limiter: `/v1/limit/check` on both backends, Redis-only regressions, failure policy,
//! concurrency across instances.
use std::time::Duration;

use palisade::model::{ClientIp, SubjectKey};

use reqwest::StatusCode;

use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_TOKEN, Backend, ChaosProxy, TestApp, assert_envelope, production_urls, socket_of,
};

use crate::on_both_backends;

mod on_redis;

on_both_backends!(
    a_full_auth_bucket_admits_exactly_its_capacity_then_429_with_exact_retry,
    retry_after_is_honoured_the_request_passes_at_the_promised_time,
    consume_false_answers_without_taking_tokens,
    cost_takes_that_many_tokens,
    ipv6_clients_share_their_slash_64,
    multiplier_zero_blocks_until_it_expires_and_two_doubles_the_budget,
    shadow_budget_reports_but_never_blocks,
    anonymous_reads_and_writes_use_their_own_budgets,
    bad_limit_checks_are_400_never_500,
    only_limiter_and_admin_may_check,
    sixty_four_concurrent_checks_admit_exactly_the_capacity,
    concurrent_checks_in_one_instance_are_answered_one_after_another,
);

fn login(user: &str, ip: &str) -> Value {
    json!({"endpoint": "/auth/login", "method": "POST", "ip": ip, "user_id": user})
}

/// The brute-force shape: one account from one IP against the auth class (5/min/account).
async fn a_full_auth_bucket_admits_exactly_its_capacity_then_429_with_exact_retry(app: TestApp) {
    for expected in (0..5).rev() {
        let response = app.limit_check(&login("alice", "203.0.113.7")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-ratelimit-limit"], "5");
        assert_eq!(
            response.headers()["x-ratelimit-remaining"],
            expected.to_string().as_str()
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["scope"], "endpoint_user");
        assert_eq!(body["budget"], "auth-account");
        assert_eq!(body["class"], "auth");
    }
    let denied = app.limit_check(&login("alice", "203.0.113.7")).await;
    let headers = denied.headers().clone();
    assert_eq!(headers["retry-after"], "12");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert!(
        headers["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("\"auth-account\";q=5;w=60")
    );
    let body = assert_envelope(denied, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    let details = &body["error"]["details"];
    assert_eq!(details["scope"], "endpoint_user");
    assert_eq!(details["limit"], 5);
    let retry = details["retry_after_ms"].as_u64().unwrap();
    match app.backend {
        // One token every 12 s, and the manual clock did not move: exact.
        Backend::Embedded => assert_eq!(retry, 12_000),
        // Real time passed between the calls (Redis TIME): within a few ms below 12 s.
        Backend::Production => assert!((11_900..=12_000).contains(&retry), "{retry}"),
    }
    // Another account from the same IP still passes (auth-ip allows 10).
    assert_eq!(
        app.limit_check(&login("bob", "203.0.113.7")).await.status(),
        StatusCode::OK
    );
}

/// A fresh app on the same backend with one extra budget.
async fn with_budget(app: &TestApp, budget: palisade::config::BudgetSettings) -> TestApp {
    TestApp::spawn_with(app.backend, |settings| settings.limits.budgets.push(budget))
        .await
        .expect("same backend as the test")
}

fn ip_budget(
    name: &str,
    classes: &[&str],
    limit: u32,
    period_s: u32,
    shadow: bool,
) -> palisade::config::BudgetSettings {
    palisade::config::BudgetSettings {
        name: name.to_owned(),
        scope: palisade::config::ScopeKind::Ip,
        classes: classes.iter().map(|c| (*c).to_owned()).collect(),
        limit,
        period_s,
        burst: None,
        when: palisade::config::When::Always,
        shadow,
    }
}

async fn retry_after_is_honoured_the_request_passes_at_the_promised_time(app: TestApp) {
    // 3 per second: a short period so the production variant waits in real time briefly.
    let app = with_budget(&app, ip_budget("fast", &["read"], 3, 1, false)).await;
    let budget = json!({"endpoint": "/v1/fast", "method": "GET", "ip": "198.51.100.1"});
    let mut denial = None;
    for _ in 0..10 {
        let response = app.limit_check(&budget).await;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            denial = Some(response.json::<Value>().await.unwrap());
            break;
        }
    }
    let retry = denial.expect("budget ran out")["error"]["details"]["retry_after_ms"]
        .as_u64()
        .unwrap();
    assert!(retry > 1 && retry <= 334, "{retry}");
    if app.backend == Backend::Embedded {
        app.advance(Duration::from_millis(retry - 1)).await;
        assert_eq!(
            app.limit_check(&budget).await.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "1 ms early"
        );
        app.advance(Duration::from_millis(1)).await;
    } else {
        app.advance(Duration::from_millis(retry)).await;
    }
    assert_eq!(
        app.limit_check(&budget).await.status(),
        StatusCode::OK,
        "at the promised time"
    );
}

async fn consume_false_answers_without_taking_tokens(app: TestApp) {
    let mut peek = login("carol", "192.0.2.1");
    peek["consume"] = json!(false);
    for _ in 0..20 {
        let response = app.limit_check(&peek).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-ratelimit-remaining"], "5");
    }
    let taken = app.limit_check(&login("carol", "192.0.2.1")).await;
    assert_eq!(taken.headers()["x-ratelimit-remaining"], "4");
}

async fn cost_takes_that_many_tokens(app: TestApp) {
    let mut heavy = login("dave", "192.0.2.2");
    heavy["cost"] = json!(3);
    assert_eq!(
        app.limit_check(&heavy).await.headers()["x-ratelimit-remaining"],
        "2"
    );
    let denied = app.limit_check(&heavy).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // The denied request took nothing: two single requests still pass.
    assert_eq!(
        app.limit_check(&login("dave", "192.0.2.2")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.limit_check(&login("dave", "192.0.2.2")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.limit_check(&login("dave", "192.0.2.2")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

async fn ipv6_clients_share_their_slash_64(app: TestApp) {
    // auth-ip: 10 per minute per IP; rotating addresses within one /64 does not help.
    for i in 0..10 {
        let ip = format!("2001:db8:7:7::{:x}", i + 1);
        let response = app.limit_check(&login(&format!("user{i}"), &ip)).await;
        assert_eq!(response.status(), StatusCode::OK, "attempt {i}");
    }
    let denied = app
        .limit_check(&login("user-x", "2001:db8:7:7:ffff::1"))
        .await;
    let body = assert_envelope(denied, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(body["error"]["details"]["scope"], "endpoint_ip");
    assert_eq!(
        app.limit_check(&login("user-y", "2001:db8:7:8::1"))
            .await
            .status(),
        StatusCode::OK,
        "next /64"
    );
}

async fn multiplier_zero_blocks_until_it_expires_and_two_doubles_the_budget(app: TestApp) {
    let limiter = &app.app.limiter;
    let erin = SubjectKey::user("erin", 64).unwrap();
    limiter
        .publish_multiplier(&erin, Some("auth"), 0.0, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    let denied = app.limit_check(&login("erin", "192.0.2.3")).await;
    let body = assert_envelope(denied, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    let retry = body["error"]["details"]["retry_after_ms"].as_u64().unwrap();
    assert!(
        (29_000..=30_000).contains(&retry),
        "blocked until the multiplier expires: {retry}"
    );
    assert_eq!(body["error"]["details"]["limit"], 0);

    let frank = SubjectKey::user("frank", 64).unwrap();
    limiter
        .publish_multiplier(&frank, None, 2.0, None)
        .await
        .unwrap();
    let mut admitted = 0;
    for _ in 0..15 {
        if app.limit_check(&login("frank", "192.0.2.4")).await.status() == StatusCode::OK {
            admitted += 1;
        }
    }
    // auth-account (5) doubled = 10, auth-ip (10) unchanged: 10.
    assert_eq!(admitted, 10);

    let ip = ClientIp::parse("192.0.2.5", 64).unwrap();
    limiter
        .publish_multiplier(&SubjectKey::ip(&ip), Some("auth"), 0.5, None)
        .await
        .unwrap();
    let response = app.limit_check(&login("gina", "192.0.2.5")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    // auth-account 5 vs auth-ip 10·0.5 = 5: both 4 left after this one; the tie goes to the
    // smaller limit, and the multiplier is reported with the deciding scope.
    assert_eq!(body["remaining"], 4);
}

async fn shadow_budget_reports_but_never_blocks(app: TestApp) {
    let app = with_budget(&app, ip_budget("trial", &["read"], 2, 60, true)).await;
    let read = json!({"endpoint": "/v1/items", "ip": "192.0.2.9"});
    for i in 0..5 {
        let response = app.limit_check(&read).await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "shadow never blocks ({i})"
        );
        let shadow = response
            .headers()
            .get("x-palisade-shadow")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = response.json().await.unwrap();
        if i < 2 {
            assert!(shadow.is_none());
        } else {
            assert_eq!(shadow.as_deref(), Some("would-block; budgets=trial"));
            assert_eq!(body["shadow_blocked"], json!(["trial"]));
        }
    }
}

async fn anonymous_reads_and_writes_use_their_own_budgets(app: TestApp) {
    let read = app
        .limit_check(&json!({"endpoint": "/v1/feed", "ip": "192.0.2.10"}))
        .await;
    let body: Value = read.json().await.unwrap();
    assert_eq!(body["class"], "read");
    assert_eq!(body["budget"], "ip-anon");
    assert_eq!(body["limit"], 60);
    let write = app
        .limit_check(
            &json!({"endpoint": "/v1/feed", "method": "post", "ip": "192.0.2.10", "user_id": "u1"}),
        )
        .await;
    let body: Value = write.json().await.unwrap();
    assert_eq!(body["class"], "write");
    assert_eq!(body["budget"], "user-write");
    let search = app
        .limit_check(&json!({"endpoint": "/search?q=x", "ip": "192.0.2.10"}))
        .await;
    let body: Value = search.json().await.unwrap();
    assert_eq!(body["class"], "expensive");
    assert_eq!(body["budget"], "expensive-ip");
}

async fn bad_limit_checks_are_400_never_500(app: TestApp) {
    let long = "u".repeat(app.settings.http.max_key_length + 1);
    let cases = [
        json!({"endpoint": "/x", "ip": "999.1.1.1"}),
        json!({"endpoint": "/x", "ip": "not-an-ip"}),
        json!({"endpoint": "no-slash", "ip": "192.0.2.1"}),
        json!({"endpoint": "", "ip": "192.0.2.1"}),
        json!({"endpoint": "/x", "ip": "192.0.2.1", "cost": 0}),
        json!({"endpoint": "/x", "ip": "192.0.2.1", "cost": 1_000_000}),
        json!({"endpoint": "/auth/login", "ip": "192.0.2.1", "user_id": "a", "cost": 6}),
        json!({"endpoint": "/x", "ip": "192.0.2.1", "cost": -1}),
        json!({"endpoint": "/x", "ip": "192.0.2.1", "user_id": long}),
        json!({"endpoint": "/x", "ip": "192.0.2.1", "user_id": ""}),
        json!({"endpoint": "/x", "ip": "192.0.2.1", "method": "GE T"}),
        json!({"endpoint": "/x", "ip": "192.0.2.1", "surprise": 1}),
        json!({"ip": "192.0.2.1"}),
    ];
    for case in cases {
        let response = app.limit_check(&case).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{case}");
    }
}

async fn only_limiter_and_admin_may_check(app: TestApp) {
    let (_, ingest) = app.create_token("ingest", "auth-service").await;
    let (_, limiter) = app.create_token("limiter", "gateway").await;
    let body = json!({"endpoint": "/v1/x", "ip": "192.0.2.1"});
    assert_envelope(
        app.post("/v1/limit/check", Some(&ingest), &body).await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
    assert_eq!(
        app.post("/v1/limit/check", Some(&limiter), &body)
            .await
            .status(),
        StatusCode::OK
    );
    assert_envelope(
        app.post("/v1/limit/check", None, &body).await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
}

/// Many concurrent checks of one key (two instances on the production backend, which share
/// Redis) admit exactly what the bucket holds.
async fn sixty_four_concurrent_checks_admit_exactly_the_capacity(app: TestApp) {
    let second = match app.backend {
        Backend::Production => Some(app.another_instance().await),
        Backend::Embedded => None,
    };
    let bases: Vec<String> = std::iter::once(app.base.clone())
        .chain(second.as_ref().map(|s| s.base.clone()))
        .collect();
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..64 {
        let url = format!("{}/v1/limit/check", bases[task % bases.len()]);
        let client = client.clone();
        tasks.spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..4 {
                let response = client
                    .post(&url)
                    .bearer_auth(ADMIN_TOKEN)
                    .json(&login("hot-account", "203.0.113.200"))
                    .send()
                    .await
                    .unwrap();
                assert!(matches!(
                    response.status(),
                    StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
                ));
                admitted += u32::from(response.status() == StatusCode::OK);
            }
            admitted
        });
    }
    let mut total = 0;
    while let Some(admitted) = tasks.join_next().await {
        total += admitted.unwrap();
    }
    // 256 attempts within well under 12 s (the refill interval): exactly the capacity.
    assert_eq!(total, 5);
}

/// Forty checks of one account at once from one instance (on Redis they are coalesced into
/// shared script calls): exactly the capacity passes, and the admitted ones saw the bucket
/// drain one token at a time, as if each had been its own call.
async fn concurrent_checks_in_one_instance_are_answered_one_after_another(app: TestApp) {
    forty_checks_of_one_account_drain_it_one_token_at_a_time(&app).await;
}

/// The same with `limits.coalesce = false` (one script call per check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn checks_without_coalescing_give_the_same_answers() {
    let Some(app) = TestApp::spawn_with(Backend::Production, |settings| {
        settings.limits.coalesce = false
    })
    .await
    else {
        return;
    };
    forty_checks_of_one_account_drain_it_one_token_at_a_time(&app).await;
}

async fn forty_checks_of_one_account_drain_it_one_token_at_a_time(app: &TestApp) {
    let request = palisade::limiter::LimitRequest {
        method: "POST".to_owned(),
        endpoint: "/auth/login".to_owned(),
        ip: ClientIp::parse("203.0.113.210", 64).unwrap(),
        user: Some(SubjectKey::user("queued", 64).unwrap()),
        device: None,
        tenant: None,
        recipient: None,
        cost: 1,
        consume: true,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (limiter, request) = (app.app.limiter.clone(), request.clone());
        tasks.spawn(async move { limiter.check(&request).await.unwrap() });
    }
    let mut remaining = Vec::new();
    let mut denied = 0;
    while let Some(decision) = tasks.join_next().await {
        let decision = decision.unwrap();
        if decision.allowed {
            remaining.push(decision.deciding_scope().unwrap().remaining);
        } else {
            denied += 1;
            assert!(decision.retry_after_ms > 0, "{decision:?}");
        }
    }
    remaining.sort_unstable();
    assert_eq!(remaining, vec![0, 1, 2, 3, 4]);
    assert_eq!(denied, 35);
}

/// One sequence of checks (several accounts, IPs, costs, peeks, multipliers) gives the same
/// decisions on the embedded backend (the reference model on a manual clock) and on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn both_backends_give_identical_decisions_for_the_same_sequence() {
    // Real time passes in Redis and not on the manual clock: use budgets that refill too
    // slowly to matter within the test, and no L1 (an in-process cache is not the model).
    let slow = |settings: &mut palisade::Settings| {
        for budget in &mut settings.limits.budgets {
            budget.period_s = 86_400;
            budget.limit = budget.limit.min(1000);
        }
        settings.limits.l1_ttl_ms = 0;
    };
    let Some(production) = TestApp::spawn_with(Backend::Production, slow).await else {
        return;
    };
    let embedded = TestApp::spawn_with(Backend::Embedded, slow).await.unwrap();
    let mut sequence = Vec::new();
    for i in 0..60u32 {
        let user = format!("acct{}", i % 4);
        let ip = format!("198.51.100.{}", i % 3);
        let mut body = login(&user, &ip);
        body["cost"] = json!(1 + i % 3);
        body["consume"] = json!(i % 7 != 0);
        if i % 5 == 0 {
            body["device_id"] = json!(format!("dev{}", i % 2));
        }
        if i % 11 == 0 {
            body["endpoint"] = json!("/v1/feed");
            body["method"] = json!("GET");
        }
        sequence.push(body);
    }
    for app in [&embedded, &production] {
        let subject = SubjectKey::user("acct3", 64).unwrap();
        app.app
            .limiter
            .publish_multiplier(&subject, Some("auth"), 2.0, None)
            .await
            .unwrap();
    }
    let mut answers = [Vec::new(), Vec::new()];
    for (answer, app) in answers.iter_mut().zip([&embedded, &production]) {
        for body in &sequence {
            let response = app.limit_check(body).await;
            let status = response.status().as_u16();
            let remaining = response
                .headers()
                .get("x-ratelimit-remaining")
                .map(|v| v.to_str().unwrap().to_owned());
            let policy = response
                .headers()
                .get("ratelimit")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = response.json().await.unwrap();
            let scope = body
                .get("scope")
                .cloned()
                .unwrap_or_else(|| body["error"]["details"]["scope"].clone());
            // `t=` (seconds to reset) depends on real time in Redis; compare remaining only.
            let policy = policy.map(|p| {
                p.split(", ")
                    .map(|s| s.split(";t=").next().unwrap().to_owned())
                    .collect::<Vec<_>>()
            });
            answer.push((status, remaining, scope, policy));
        }
    }
    assert_eq!(answers[0], answers[1]);
    assert!(answers[0].iter().any(|a| a.0 == 429) && answers[0].iter().any(|a| a.0 == 200));
}

/// The `tower` middleware enforces the same buckets in front of another axum service, with
/// the envelope and headers; forwarded client addresses count only from trusted proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_layer_protects_another_axum_service() {
    use palisade::api::layer::{LayerConfig, RateLimitLayer};
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let serve = |trusted: Vec<ipnetwork::IpNetwork>| {
        let layer = RateLimitLayer::new(
            app.app.limiter.clone(),
            LayerConfig {
                trusted_proxies: trusted,
                ipv6_prefix_len: 64,
                ids: app.settings.http.identifiers(),
            },
        );
        async move {
            let service = axum::Router::new()
                .route("/auth/login", axum::routing::post(|| async { "welcome" }))
                .layer(layer);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move {
                axum::serve(
                    listener,
                    service.into_make_service_with_connect_info::<std::net::SocketAddr>(),
                )
                .await
                .unwrap();
            });
            base
        }
    };
    let behind_proxy = serve(vec!["127.0.0.1/32".parse().unwrap()]).await;
    let client = reqwest::Client::new();
    let login_from = |base: &str, forwarded: &str| {
        client
            .post(format!("{base}/auth/login"))
            .header("x-forwarded-for", forwarded.to_owned())
            .send()
    };
    for _ in 0..10 {
        let response = login_from(&behind_proxy, "203.0.113.20").await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().contains_key("x-ratelimit-remaining"));
        assert_eq!(response.text().await.unwrap(), "welcome");
    }
    let denied = login_from(&behind_proxy, "203.0.113.20").await.unwrap();
    assert_eq!(denied.headers()["retry-after"], "6");
    assert!(denied.headers().contains_key("x-request-id"));
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED");
    assert_eq!(body["error"]["details"]["scope"], "endpoint_ip");
    // Another client behind the same proxy has its own bucket.
    assert_eq!(
        login_from(&behind_proxy, "203.0.113.21")
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );

    // Without trusted proxies the header is ignored: every request is the peer 127.0.0.1.
    let direct = serve(vec![]).await;
    let mut statuses = Vec::new();
    for i in 0..11 {
        statuses.push(
            login_from(&direct, &format!("198.51.100.{i}"))
                .await
                .unwrap()
                .status(),
        );
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        10,
        "{statuses:?}"
    );
}

/// The budgets tables of README.md and of the client guide are the output of
/// `palisade budgets` with the default settings.
#[test]
fn readme_budgets_table_matches_palisade_budgets() {
    let table =
        palisade::limiter::Budgets::from_settings(&palisade::config::LimitSettings::default())
            .markdown();
    for doc in ["README.md", "docs/GUIDE.md", "docs/CLIENTS.md"] {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(doc))
                .unwrap();
        assert!(
            text.contains(&table),
            "{doc} is stale: paste the output of `palisade budgets`"
        );
    }
}
