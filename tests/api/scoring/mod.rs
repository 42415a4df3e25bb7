//! Scoring: factors from every signal combined into multipliers with reasons, published to
//! the buckets; telemetry baselines and anomalies; repeat offenders; alerts and webhooks; the
//! decision stream. On both backends.
use std::sync::{Arc, Mutex};

use std::time::Duration;

use reqwest::StatusCode;

use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, assert_envelope};

use crate::on_both_backends;

mod instances;
mod publish;
mod webhooks; // signed alert deliveries and retries

on_both_backends!(
    datacenter_ip_and_failed_logins_each_lower_the_multiplier_and_the_budget,
    a_device_jumping_to_100x_its_baseline_is_tightened_with_one_alert,
    repeat_offenders_from_telemetry_are_listed_and_tightened,
    repeat_offenders_from_limit_checks_are_tightened,
    shadow_factors_are_reported_but_not_enforced,
    a_random_key_flood_keeps_tracked_baselines_bounded,
    multiplier_queries_are_validated_and_need_the_limiter_role,
    telemetry_batches_are_validated_and_idempotent,
    dropping_an_app_frees_every_service,
);

const AWS: &[(&str, &str)] = &[(
    "data/ranges/datacenter/aws-ip-ranges.json.gz",
    "ranges/datacenter/aws-ip-ranges.json",
)];

/// An AWS address (datacenter in the shared lists).
const AWS_IP: &str = "3.5.140.1";

impl TestApp {
    async fn multipliers(&self, query: &str) -> Value {
        let response = self
            .get(&format!("/v1/multipliers?{query}"), Some(ADMIN_TOKEN))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{query}");
        response.json().await.unwrap()
    }

    async fn post_requests(&self, body: &Value) -> Value {
        let response = self
            .post("/v1/events/requests", Some(ADMIN_TOKEN), body)
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    async fn alerts(&self, query: &str) -> Vec<Value> {
        let page: Value = self
            .get(&format!("/v1/alerts{query}"), Some(ADMIN_TOKEN))
            .await
            .json()
            .await
            .unwrap();
        page["items"].as_array().unwrap().clone()
    }

    fn now_ms(&self) -> i64 {
        self.app.clock.now_ms()
    }

    async fn fail_logins(&self, prefix: &str, account: &str, ip: &str, n: usize) {
        let events: Vec<Value> = (0..n)
            .map(|i| json!({"event_id": format!("{prefix}-{i}"), "type": "login_failure", "account": account, "ip": ip}))
            .collect();
        let response = self
            .post(
                "/v1/events/auth",
                Some(ADMIN_TOKEN),
                &json!({ "events": events }),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
    }
}

fn reason<'a>(key: &'a Value, code: &str) -> &'a Value {
    key["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["code"] == code)
        .unwrap_or_else(|| panic!("no reason {code} in {key}"))
}

fn ts(ms: i64) -> String {
    palisade::clock::rfc3339(ms)
}

/// Telemetry events from `ip` with `key`: `per_minute` a minute for the `minutes` minutes
/// before `now`.
fn history(ip: &str, key: (&str, &str), now: i64, minutes: i64, per_minute: usize) -> Vec<Value> {
    let mut events = Vec::new();
    for back in (1..=minutes).rev() {
        for _ in 0..per_minute {
            events.push(json!({"ts": ts(now - back * 60_000), "ip": ip, key.0: key.1, "endpoint": "/v1/feed", "status": 200}));
        }
    }
    events
}

/// End to end: a datacenter IP, an unattested device and a failed-login burst each lower the
/// multiplier `/v1/multipliers` reports, with their reasons, and `/v1/limit/check` enforces
/// the lower budget right after.
async fn datacenter_ip_and_failed_logins_each_lower_the_multiplier_and_the_budget(app: TestApp) {
    app.load_data(AWS).await;
    let auth = "endpoint=/auth/login&method=POST";
    let view = app
        .multipliers(&format!(
            "ip={AWS_IP}&user_id=carol&device_id=phone-1&{auth}"
        ))
        .await;
    let device = &view["keys"]["device:phone-1"];
    assert_eq!(device["multiplier"], 0.25, "{view}");
    assert_eq!(
        reason(device, "attestation_unverified")["signal"],
        "attestation"
    );
    assert_eq!(view["class"], "auth");
    let ip = &view["keys"][format!("ip:{AWS_IP}")];
    // The public factor: auth is reached without an account.
    assert_eq!(ip["multiplier"], 0.25, "{view}");
    assert_eq!(reason(ip, "reputation_datacenter")["signal"], "reputation");
    assert_eq!(view["keys"]["user:carol"]["multiplier"], 1.0);
    assert_eq!(view["multiplier"], 0.25);
    // On a read endpoint the datacenter factor is the non-public one.
    let read = app
        .multipliers(&format!("ip={AWS_IP}&endpoint=/v1/feed"))
        .await;
    assert_eq!(read["keys"][format!("ip:{AWS_IP}")]["multiplier"], 0.5);

    // The lower budget is enforced at once: auth-ip is 10/min, x 0.25 = 2.5 tokens.
    let login =
        json!({"endpoint": "/auth/login", "method": "POST", "ip": AWS_IP, "user_id": "carol"});
    let body: Value = app.limit_check(&login).await.json().await.unwrap();
    assert_eq!(
        (body["scope"].as_str(), body["limit"].as_u64()),
        (Some("endpoint_ip"), Some(2)),
        "{body}"
    );
    assert_eq!(body["multiplier"], 0.25);
    assert_eq!(app.limit_check(&login).await.status(), StatusCode::OK);
    let denied = assert_envelope(
        app.limit_check(&login).await,
        StatusCode::TOO_MANY_REQUESTS,
        "RATE_LIMITED",
    )
    .await;
    assert_eq!(denied["error"]["details"]["scope"], "endpoint_ip");

    // A failed-login burst (5 = challenge) tightens the account on auth.
    app.fail_logins("burst", "carol", "192.0.2.77", 5).await;
    let view = app.multipliers(&format!("user_id=carol&{auth}")).await;
    let user = &view["keys"]["user:carol"];
    assert_eq!(user["multiplier"], 0.5, "{view}");
    assert_eq!(reason(user, "login_failures")["signal"], "velocity");
    assert!(reason(user, "login_failures")["expires_at"].is_string());
    // …and auth-account (5/min) is 2.5 tokens now, from any IP.
    let clean =
        json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.9", "user_id": "carol"});
    let body: Value = app.limit_check(&clean).await.json().await.unwrap();
    assert_eq!(
        (body["scope"].as_str(), body["limit"].as_u64()),
        (Some("endpoint_user"), Some(2)),
        "{body}"
    );
    assert_eq!(body["multiplier"], 0.5);
    // The unattested device's budget on auth: device (600/min) x 0.25.
    let from_device = json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.10", "device_id": "phone-1", "consume": false});
    let response = app.limit_check(&from_device).await;
    let policy = response.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.contains("\"device\";q=150"), "{policy}");
    // Reads are not affected by an auth-class factor.
    let view = app.multipliers("user_id=carol&endpoint=/v1/feed").await;
    assert_eq!(view["keys"]["user:carol"]["multiplier"], 1.0);
    // …and nothing is written for them: only auth's multiplier is published in Redis (one
    // key per challenged account, not one per class).
    if let Some(url) = &app.settings.redis_url {
        let user = palisade::model::SubjectKey::user("carol", 64).unwrap();
        let keys = &app.app.stores.keys;
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (auth, read): (bool, bool) = redis::pipe()
            .exists(keys.multiplier(&user, "auth"))
            .exists(keys.multiplier(&user, "read"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!((auth, read), (true, false));
    }
}

/// A device that suddenly sends 100x its steady rate (a scraper, a stolen token) gets a
/// tighter multiplier for the cooling period and one alert, not one per request; a steady
/// heavy user is left alone.
async fn a_device_jumping_to_100x_its_baseline_is_tightened_with_one_alert(app: TestApp) {
    let now = app.now_ms();
    let mut events = history("192.0.2.10", ("device_id", "dev-jump"), now, 15, 10);
    events.extend(history("192.0.2.11", ("user_id", "heavy"), now, 15, 250));
    // As a gateway posts it: in time order.
    events.sort_by(|a, b| a["ts"].as_str().cmp(&b["ts"].as_str()));
    for chunk in events.chunks(5000) {
        let answer = app.post_requests(&json!({ "events": chunk })).await;
        assert_eq!(answer["anomalies"], 0);
    }
    // This minute: the device at 120x (from a network it was not seen on, so only the
    // device has a history to jump from), the heavy user at its usual rate.
    let mut burst: Vec<Value> = (0..1200)
        .map(|_| json!({"ts": ts(now), "ip": "198.18.0.1", "device_id": "dev-jump", "endpoint": "/v1/feed", "status": 200}))
        .collect();
    burst.extend((0..250).map(|_| json!({"ts": ts(now), "ip": "192.0.2.11", "user_id": "heavy", "endpoint": "/v1/feed", "status": 200})));
    let answer = app.post_requests(&json!({ "events": burst })).await;
    assert_eq!(answer["anomalies"], 1, "{answer}");
    assert_eq!(answer["accepted"], 1450);

    let alerts = app.alerts("?kind=anomaly").await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["subject"], "device:dev-jump");
    assert!(alerts[0]["details"]["ratio"].as_f64().unwrap() >= 100.0);
    let view = app
        .multipliers("device_id=dev-jump&endpoint=/v1/feed")
        .await;
    let device = &view["keys"]["device:dev-jump"];
    assert_eq!(device["multiplier"], 0.25, "{view}");
    assert_eq!(reason(device, "anomaly")["reference"], alerts[0]["id"]);
    assert_eq!(app.multipliers("user_id=heavy").await["multiplier"], 1.0);

    // Still hammering: no second alert within the cooling period.
    let more: Vec<Value> = (0..1200)
        .map(|_| json!({"ts": ts(now), "ip": "198.18.0.1", "device_id": "dev-jump", "endpoint": "/v1/feed", "status": 200}))
        .collect();
    assert_eq!(
        app.post_requests(&json!({ "events": more })).await["anomalies"],
        0
    );
    assert_eq!(app.alerts("?kind=anomaly").await.len(), 1);

    // The device's budget (600/min) is a quarter.
    let check = json!({"endpoint": "/v1/feed", "ip": "192.0.2.50", "user_id": "u-jump", "device_id": "dev-jump"});
    let body: Value = app.limit_check(&check).await.json().await.unwrap();
    assert_eq!(
        (body["scope"].as_str(), body["limit"].as_u64()),
        (Some("device"), Some(150)),
        "{body}"
    );
}

/// A client that keeps hammering after its 429s (a bot ignoring Retry-After) is listed and
/// tightened.
async fn repeat_offenders_from_telemetry_are_listed_and_tightened(app: TestApp) {
    let refused: Vec<Value> = (0..150)
        .map(|_| json!({"ip": "198.51.100.77", "endpoint": "/v1/search", "status": 429}))
        .collect();
    let served: Vec<Value> = (0..50)
        .map(|_| json!({"ip": "198.51.100.78", "endpoint": "/v1/search", "status": 429}))
        .collect();
    app.post_requests(&json!({ "events": refused })).await;
    app.post_requests(&json!({ "events": served })).await;
    assert_eq!(app.app.scoring.flush_offenders().await.unwrap(), 1);

    let page: Value = app
        .get("/v1/offenders?window_s=60", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["items"][0]["key"], "ip:198.51.100.77", "{page}");
    assert_eq!(page["items"][0]["count"], 150);
    assert!(page["items"][0]["tightened_until"].is_string());
    assert_eq!(page["items"][1]["key"], "ip:198.51.100.78");
    assert!(page["items"][1]["tightened_until"].is_null());

    let view = app.multipliers("ip=198.51.100.77").await;
    assert_eq!(view["multiplier"], 0.5);
    reason(&view["keys"]["ip:198.51.100.77"], "repeat_offender");
    assert_eq!(app.alerts("?kind=repeat_offender").await.len(), 1);
    assert_eq!(app.multipliers("ip=198.51.100.78").await["multiplier"], 1.0);
    let bad = app.get("/v1/offenders?window_s=0", Some(ADMIN_TOKEN)).await;
    assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

/// The limiter's own 429s count too: an IP hammering the login after being refused.
async fn repeat_offenders_from_limit_checks_are_tightened(app: TestApp) {
    let app = app_with(app, |s| s.scoring.offenders.per_minute = 20).await;
    let login = json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.200"});
    let mut refused = 0;
    for _ in 0..50 {
        if app.limit_check(&login).await.status() == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    assert_eq!(refused, 40, "auth-ip admits 10 a minute");
    assert_eq!(app.app.scoring.flush_offenders().await.unwrap(), 1);
    let view = app
        .multipliers("ip=203.0.113.200&endpoint=/auth/login")
        .await;
    assert_eq!(view["multiplier"], 0.5, "{view}");
}

/// Rebuilds a test app with adjusted settings on the same backend.
async fn app_with(app: TestApp, adjust: impl FnOnce(&mut palisade::Settings)) -> TestApp {
    let backend = app.backend;
    drop(app);
    TestApp::spawn_with(backend, adjust)
        .await
        .expect("the backend existed a moment ago")
}

/// A new factor tried in shadow: reported with what it would do, never enforced.
async fn shadow_factors_are_reported_but_not_enforced(app: TestApp) {
    let app = app_with(app, |s| s.scoring.shadow = vec!["reputation".to_owned()]).await;
    app.load_data(AWS).await;
    let view = app
        .multipliers(&format!("ip={AWS_IP}&endpoint=/v1/feed"))
        .await;
    let ip = &view["keys"][format!("ip:{AWS_IP}")];
    assert_eq!(ip["multiplier"], 1.0, "{view}");
    assert_eq!(ip["would_be"], 0.5);
    assert_eq!(reason(ip, "reputation_datacenter")["shadow"], true);
    let body: Value = app
        .limit_check(&json!({"endpoint": "/v1/feed", "ip": AWS_IP}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (body["scope"].as_str(), body["limit"].as_u64()),
        (Some("ip"), Some(60)),
        "{body}"
    );
}

/// An attacker spraying random user ids cannot grow the baselines' memory.
async fn a_random_key_flood_keeps_tracked_baselines_bounded(app: TestApp) {
    let app = app_with(app, |s| s.scoring.anomaly.capacity = 4096).await;
    let (_, capacity, bytes) = app.app.scoring.baseline_keys();
    assert!((4096..4096 + 64).contains(&capacity));
    for batch in 0..4 {
        let events: Vec<Value> = (0..5000)
            .map(|i| json!({"ip": "192.0.2.1", "user_id": format!("rand-{batch}-{i}"), "endpoint": "/v1/feed", "status": 200}))
            .collect();
        app.post_requests(&json!({ "events": events })).await;
    }
    let (tracked, _, after) = app.app.scoring.baseline_keys();
    assert!(tracked <= capacity, "{tracked} > {capacity}");
    assert_eq!(after, bytes, "fixed memory");
}

async fn multiplier_queries_are_validated_and_need_the_limiter_role(app: TestApp) {
    for query in [
        "",
        "ip=nope",
        "user_id=",
        "ip=192.0.2.1&endpoint=feed",
        "bogus=1",
    ] {
        let response = app
            .get(&format!("/v1/multipliers?{query}"), Some(ADMIN_TOKEN))
            .await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    let (_, ingest) = app.create_token("ingest", "auth-svc").await;
    let (_, limiter) = app.create_token("limiter", "gateway").await;
    let (_, analyst) = app.create_token("analyst", "alice").await;
    let forbidden = app.get("/v1/multipliers?ip=192.0.2.1", Some(&ingest)).await;
    assert_envelope(forbidden, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    assert_eq!(
        app.get("/v1/multipliers?ip=192.0.2.1", Some(&limiter))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        app.get("/v1/decisions", Some(&limiter)).await.status(),
        StatusCode::OK
    );
    let forbidden = app.get("/v1/alerts", Some(&limiter)).await;
    assert_envelope(forbidden, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    assert_eq!(
        app.get("/v1/alerts", Some(&analyst)).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.get("/v1/offenders", Some(&analyst)).await.status(),
        StatusCode::OK
    );
    let forbidden = app
        .post(
            "/v1/events/requests",
            Some(&analyst),
            &json!({"events": []}),
        )
        .await;
    assert_envelope(forbidden, StatusCode::FORBIDDEN, "FORBIDDEN").await;
}

async fn telemetry_batches_are_validated_and_idempotent(app: TestApp) {
    let bad = json!({"events": [
        {"ip": "192.0.2.1", "endpoint": "/x", "status": 200},
        {"ip": "192.0.2.1", "endpoint": "/x", "status": 999},
        {"ip": "no", "endpoint": "/x", "status": 200},
    ]});
    let body = assert_envelope(
        app.post("/v1/events/requests", Some(ADMIN_TOKEN), &bad)
            .await,
        StatusCode::BAD_REQUEST,
        "INVALID_ARGUMENT",
    )
    .await;
    let indexes: Vec<u64> = body["error"]["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, vec![1, 2]);
    let too_many: Vec<Value> = (0..5001)
        .map(|_| json!({"ip": "192.0.2.1", "endpoint": "/x", "status": 200}))
        .collect();
    let response = app
        .post(
            "/v1/events/requests",
            Some(ADMIN_TOKEN),
            &json!({ "events": too_many }),
        )
        .await;
    assert_envelope(response, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE").await;
    let empty = app
        .post(
            "/v1/events/requests",
            Some(ADMIN_TOKEN),
            &json!({"events": []}),
        )
        .await;
    assert_envelope(empty, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;

    let batch = json!({"batch_id": "gw-1-0001", "events": [{"ip": "192.0.2.1", "endpoint": "/x", "status": 429}]});
    let first = app.post_requests(&batch).await;
    assert_eq!(
        (first["accepted"].as_u64(), first["duplicate"].as_bool()),
        (Some(1), Some(false))
    );
    let again = app.post_requests(&batch).await;
    assert_eq!(
        (again["accepted"].as_u64(), again["duplicate"].as_bool()),
        (Some(0), Some(true))
    );
    // Stored once, pruned after the retention.
    let pruned = app
        .app
        .ingest
        .prune_requests_once(app.now_ms() + 1)
        .await
        .unwrap();
    assert_eq!(pruned, 1, "the rejected batches were never stored");
}

/// Services refer to each other (the limiter asks scoring for defaults, scoring asks the lists,
/// the lists republish through scoring); none may keep another alive once the app is gone,
/// or each stopped app would keep its database connections (a leak found the hard way).
async fn dropping_an_app_frees_every_service(app: TestApp) {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = app.settings.clone();
    drop(app);
    if settings.redis_url.is_none() {
        settings.database_url = format!("sqlite://{}", dir.path().join("p.db").display());
        settings.data_dir = dir.path().to_owned();
    }
    let built = palisade::App::build(settings).await.expect("app builds");
    let scoring = Arc::downgrade(&built.scoring);
    let lists = Arc::downgrade(&built.lists);
    let limiter = Arc::downgrade(&built.limiter);
    let lockouts = Arc::downgrade(&built.lockouts);
    drop(built);
    assert!(scoring.upgrade().is_none(), "scoring leaked");
    assert!(lists.upgrade().is_none(), "lists leaked");
    assert!(limiter.upgrade().is_none(), "limiter leaked");
    assert!(lockouts.upgrade().is_none(), "lockouts leaked");
}
