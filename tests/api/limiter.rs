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

/// Several requests in one `token_bucket.lua` call run one after another: a later request
/// sees what an earlier one took from a shared bucket, a denied or `consume: false` request
/// takes nothing, and the bucket is written once with its final state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_with_several_requests_runs_them_in_order() {
    let Some((_, redis_url)) = production_urls() else {
        return;
    };
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("test:{{coalesce-{}}}:b", ulid::Ulid::new());
    let multiplier = format!("{key}:m");
    let mut invocation = palisade::store::scripts::TOKEN_BUCKET.prepare_invoke();
    // 4 requests on one bucket of capacity 2, refilling 1 token/s: take, peek, take, take.
    invocation.arg(4);
    for consume in [1, 0, 1, 1] {
        invocation.key(&key).key(&multiplier);
        invocation.arg(1).arg(consume).arg(1);
        invocation.arg(2).arg(1).arg(1).arg(1);
    }
    let packed: Vec<u8> = invocation.invoke_async(&mut conn).await.unwrap();
    // Little-endian 8-byte integers.
    let reply: Vec<i64> = packed
        .chunks_exact(8)
        .map(|v| i64::from_le_bytes(v.try_into().unwrap()))
        .collect();
    // Per request: admitted, then allowed, limit, remaining, reset_ms, retry_ms, multiplier,
    // multiplier TTL.
    let requests: Vec<&[i64]> = reply.chunks(8).collect();
    assert_eq!(requests.len(), 4, "{reply:?}");
    assert_eq!(requests[0][..4], [1, 1, 2, 1], "first take: one left");
    assert_eq!(
        requests[1][..4],
        [1, 1, 2, 0],
        "a peek answers as if it took one"
    );
    assert_eq!(requests[2][..4], [1, 1, 2, 0], "the peek took nothing");
    assert_eq!(requests[3][..3], [0, 0, 2], "the bucket is empty");
    assert!(
        (990..=1000).contains(&requests[3][5]),
        "retry {:?}",
        requests[3]
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (1980..=2000).contains(&ttl),
        "written once, full again in 2 s: {ttl}"
    );
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Field-guide defect: a non-integer PEXPIRE (capacity 100, refill 30/s) errored after the
/// write and left the key without a TTL. Ours writes value and TTL in one `SET … PX`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_bucket_keys_always_get_an_integer_ttl() {
    let Some(app) = TestApp::spawn_with(Backend::Production, |settings| {
        settings.limits.budgets = vec![palisade::config::BudgetSettings {
            name: "odd".to_owned(),
            scope: palisade::config::ScopeKind::Ip,
            classes: vec![],
            limit: 30,
            period_s: 1,
            burst: Some(100),
            when: palisade::config::When::Always,
            shadow: false,
        }];
    })
    .await
    else {
        return;
    };
    assert_eq!(
        app.limit_check(&json!({"endpoint": "/x", "ip": "192.0.2.50"}))
            .await
            .status(),
        StatusCode::OK
    );
    let ip = ClientIp::parse("192.0.2.50", 64).unwrap();
    let key = app.app.stores.keys.bucket(&SubjectKey::ip(&ip), "odd");
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    // One token of 30/s is 33.3 ms of window: the key lives until the bucket is full.
    assert!((1..=34).contains(&ttl), "PTTL {ttl}");
    let size: i64 = redis::cmd("STRLEN")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(size, 8, "one packed double per bucket");
}

/// After `SCRIPT FLUSH` the next check reloads the script (NOSCRIPT → load → retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_survived() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let body = json!({"endpoint": "/v1/x", "ip": "192.0.2.60"});
    assert_eq!(app.limit_check(&body).await.status(), StatusCode::OK);
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let response = app.limit_check(&body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-ratelimit-remaining"], "58");
}

/// Field-guide defect: the caller's clock drove the bucket, so a caller whose clock lagged
/// burned tokens. Two instances whose clocks disagree by a century share one bucket exactly:
/// time comes from Redis `TIME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_clocks_do_not_change_redis_buckets() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let past = app.another_instance_with_wall_clock(0).await;
    let future = app
        .another_instance_with_wall_clock(4_102_444_800_000)
        .await;
    let mut admitted = 0;
    for instance in [&past, &future, &past, &future, &past, &future, &past] {
        if instance
            .limit_check(&login("ivan", "192.0.2.70"))
            .await
            .status()
            == StatusCode::OK
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5);
}

/// Redis going away mid-run: the auth class fails closed (503), the read class passes with
/// the degraded header, account statuses are 503; when Redis returns, decisions and
/// statuses are normal again within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_auth_fails_closed_reads_fail_open_and_recover() {
    let Some((_, redis_url)) = production_urls() else {
        return;
    };
    let proxy = ChaosProxy::start(socket_of(&redis_url)).await;
    let proxied = proxy.proxied_url(&redis_url);
    let app = TestApp::spawn_with(Backend::Production, |settings| {
        settings.redis_url = Some(proxied);
        settings.store.redis_timeout_ms = 100;
    })
    .await
    .unwrap();
    let read = json!({"endpoint": "/v1/feed", "ip": "192.0.2.80"});
    assert_eq!(app.limit_check(&read).await.status(), StatusCode::OK);

    proxy.break_connections();
    for _ in 0..3 {
        let auth = app.limit_check(&login("judy", "192.0.2.80")).await;
        assert_eq!(auth.headers()["x-palisade-degraded"], "redis-unavailable");
        assert!(auth.headers().contains_key("retry-after"));
        assert_envelope(auth, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
        let read_response = app.limit_check(&read).await;
        assert_eq!(read_response.status(), StatusCode::OK);
        assert_eq!(
            read_response.headers()["x-palisade-degraded"],
            "redis-unavailable"
        );
        // The account status (read on its own Redis connection) says so too.
        let status = app
            .get("/v1/accounts/judy/status?ip=192.0.2.80", Some(ADMIN_TOKEN))
            .await;
        assert_envelope(status, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
    }

    proxy.restore();
    let restored = std::time::Instant::now();
    loop {
        let response = app.limit_check(&login("judy", "192.0.2.80")).await;
        let status = app
            .get("/v1/accounts/judy/status?ip=192.0.2.80", Some(ADMIN_TOKEN))
            .await
            .status();
        if response.status() == StatusCode::OK
            && !response.headers().contains_key("x-palisade-degraded")
            && status == StatusCode::OK
        {
            break;
        }
        assert!(
            restored.elapsed() < Duration::from_secs(1),
            "not recovered within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    assert!(
        metrics.contains("palisade_fail_open_total{class=\"read\",outcome=\"fail_open\"}"),
        "{metrics}"
    );
}

/// One sequence of checks (several accounts, IPs, costs, peeks, multipliers) gives the same
/// decisions on the embedded backend (the reference model on a manual clock) and on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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

/// Against a 3-master Redis Cluster: scopes of different subjects live in different slots
/// and are checked per slot; the budget still holds exactly, across two instances, and a
/// multiplier published next to its buckets is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_keeps_every_budget() {
    let Some((_cluster, app)) = TestApp::on_cluster().await else {
        return;
    };
    assert_eq!(
        app.get("/readyz", None)
            .await
            .json::<Value>()
            .await
            .unwrap()["hot"]["kind"],
        "redis-cluster"
    );
    let second = app.another_instance().await;
    let mut admitted = 0;
    for i in 0..12 {
        let instance = if i % 2 == 0 { &app } else { &second };
        let mut body = login("kate", "203.0.113.90");
        body["device_id"] = json!("phone-1");
        let response = instance.limit_check(&body).await;
        assert!(matches!(
            response.status(),
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
        ));
        admitted += u32::from(response.status() == StatusCode::OK);
    }
    assert_eq!(
        admitted, 5,
        "auth-account holds 5 across slots and instances"
    );

    let ip = ClientIp::parse("203.0.113.91", 64).unwrap();
    app.app
        .limiter
        .publish_multiplier(
            &SubjectKey::ip(&ip),
            Some("auth"),
            0.0,
            Some(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let blocked = second.limit_check(&login("leo", "203.0.113.91")).await;
    let body = assert_envelope(blocked, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    let scope = body["error"]["details"]["scope"].as_str().unwrap();
    assert!(
        scope == "endpoint_ip" || scope == "ip",
        "both IP-keyed scopes are blocked: {scope}"
    );
    // The denied check consumed nothing in the other slots: leo's account still has 5.
    let other_ip = second.limit_check(&login("leo", "203.0.113.92")).await;
    assert_eq!(other_ip.headers()["x-ratelimit-remaining"], "4");
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
