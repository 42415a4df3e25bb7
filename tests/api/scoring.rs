//! Scoring: factors from every signal combined into multipliers with reasons, published to
//! the buckets; telemetry baselines and anomalies; repeat offenders; alerts and webhooks; the
//! decision stream. On both backends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, assert_envelope};
use crate::on_both_backends;

on_both_backends!(
    datacenter_ip_and_failed_logins_each_lower_the_multiplier_and_the_budget,
    a_device_jumping_to_100x_its_baseline_is_tightened_with_one_alert,
    repeat_offenders_from_telemetry_are_listed_and_tightened,
    repeat_offenders_from_limit_checks_are_tightened,
    shadow_factors_are_reported_but_not_enforced,
    webhooks_get_signed_alerts_and_a_down_receiver_is_retried,
    a_random_key_flood_keeps_tracked_baselines_bounded,
    the_decision_stream_follows_changes_and_snapshots,
    a_shorter_factor_expiring_republishes_the_longer_one,
    concurrent_changes_from_two_instances_publish_the_latest_factors,
    multiplier_queries_are_validated_and_need_the_limiter_role,
    telemetry_batches_are_validated_and_idempotent,
    dropping_an_app_frees_every_service,
    a_cached_multiplier_answer_never_outlives_a_change,
    factors_asserted_together_publish_as_one_by_one,
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
    assert_eq!(device["multiplier"], 0.5, "{view}");
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
    // The unattested device's budget on auth: device (600/min) x 0.5.
    let from_device = json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.10", "device_id": "phone-1", "consume": false});
    let response = app.limit_check(&from_device).await;
    let policy = response.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.contains("\"device\";q=300"), "{policy}");
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

/// Requests a receiver got: headers and body.
type Received = Arc<Mutex<Vec<(reqwest::header::HeaderMap, Vec<u8>)>>>;

/// A local webhook receiver recording what it gets.
struct Receiver {
    got: Received,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn receiver(listener: tokio::net::TcpListener) -> Receiver {
    let got: Received = Arc::default();
    let seen = got.clone();
    let router = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let mut copy = reqwest::header::HeaderMap::new();
                    for (name, value) in &headers {
                        copy.insert(
                            reqwest::header::HeaderName::from_bytes(name.as_str().as_bytes())
                                .unwrap(),
                            reqwest::header::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                        );
                    }
                    seen.lock().unwrap().push((copy, body.to_vec()));
                    "ok"
                }
            },
        ),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    Receiver { got, _stop: tx }
}

const SECRET: &str = "webhook-secret-0123456789";

/// Alerts reach configured webhooks signed with HMAC; a receiver that is down is retried
/// later and never holds up ingestion.
async fn webhooks_get_signed_alerts_and_a_down_receiver_is_retried(app: TestApp) {
    let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up_addr = up.local_addr().unwrap();
    let down_addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let hook = |addr: std::net::SocketAddr, kinds: Vec<String>| palisade::config::WebhookSettings {
        url: format!("http://{addr}/hook"),
        secret: palisade::config::Secret::new(SECRET),
        kinds,
    };
    let app = app_with(app, |s| {
        s.scoring.webhooks = vec![
            hook(up_addr, vec![]),
            hook(down_addr, vec!["spraying".to_owned()]),
        ];
    })
    .await;
    let live = receiver(up).await;

    // Password spraying raises a `spraying` alert; the batch is answered without waiting
    // for any webhook.
    let events: Vec<Value> = (0..20)
        .map(|i| json!({"event_id": format!("w-{i}"), "type": "login_failure", "account": format!("user{i}"), "ip": "203.0.113.66"}))
        .collect();
    let started = std::time::Instant::now();
    let response = app
        .post(
            "/v1/events/auth",
            Some(ADMIN_TOKEN),
            &json!({ "events": events }),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(5));

    let round = app.app.scoring.alerts().deliver_pending().await.unwrap();
    assert_eq!((round.delivered, round.failed), (1, 1), "{round:?}");
    let (headers, body) = live.got.lock().unwrap()[0].clone();
    let payload: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payload["kind"], "spraying");
    assert_eq!(payload["subject"], "ip:203.0.113.66");
    let signature = headers["x-palisade-signature"].to_str().unwrap();
    let t: i64 = signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        signature,
        palisade::scoring::alerts::signature(SECRET, t, &body)
    );
    assert_ne!(
        signature,
        palisade::scoring::alerts::signature("wrong-secret-0123456", t, &body)
    );
    assert_eq!(
        headers["x-palisade-alert-id"],
        payload["id"].as_str().unwrap()
    );

    // Not due again before its backoff.
    assert_eq!(
        app.app
            .scoring
            .alerts()
            .deliver_pending()
            .await
            .unwrap()
            .failed,
        0
    );
    // The second receiver comes up; after the backoff the delivery succeeds.
    let late = receiver(tokio::net::TcpListener::bind(down_addr).await.unwrap()).await;
    app.advance(Duration::from_millis(1100)).await;
    let round = app.app.scoring.alerts().deliver_pending().await.unwrap();
    assert_eq!(round.delivered, 1, "{round:?}");
    assert_eq!(late.got.lock().unwrap().len(), 1);
    assert_eq!(live.got.lock().unwrap().len(), 1, "delivered once");
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

/// An enforcer keeping a local copy: a snapshot, then every change after its cursor.
async fn the_decision_stream_follows_changes_and_snapshots(app: TestApp) {
    let page: Value = app
        .get("/v1/decisions", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["snapshot"], true);
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();

    let added: Value = app
        .post(
            "/v1/lists/deny",
            Some(ADMIN_TOKEN),
            &json!({"value": "198.51.100.0/24", "reason": "scanner"}),
        )
        .await
        .json()
        .await
        .unwrap();
    let spray: Vec<Value> = (0..20)
        .map(|i| json!({"event_id": format!("d-{i}"), "type": "login_failure", "account": format!("user{i}"), "ip": "203.0.113.66"}))
        .collect();
    app.post(
        "/v1/events/auth",
        Some(ADMIN_TOKEN),
        &json!({ "events": spray }),
    )
    .await;

    let page: Value = app
        .get(&format!("/v1/decisions?since={cursor}"), Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["snapshot"], false, "{page}");
    let items = page["items"].as_array().unwrap();
    let list = items
        .iter()
        .find(|i| i["kind"] == "list")
        .expect("list change");
    assert_eq!(
        (
            list["action"].as_str(),
            list["subject"].as_str(),
            list["list"].as_str()
        ),
        (Some("set"), Some("198.51.100.0/24"), Some("deny"))
    );
    assert_eq!(list["reference"], added["id"]);
    let ip = items
        .iter()
        .find(|i| i["kind"] == "multiplier" && i["subject"] == "ip:203.0.113.66")
        .expect("multiplier change");
    assert_eq!(ip["classes"]["auth"], 0.0);
    assert_eq!(ip["classes"]["read"], 1.0);
    assert!(
        ip["reasons"]
            .as_array()
            .unwrap()
            .contains(&json!("spraying"))
    );
    let next = page["next_cursor"].as_str().unwrap().to_owned();
    assert_ne!(next, cursor);
    // Nothing new since.
    let page: Value = app
        .get(&format!("/v1/decisions?since={next}"), Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["items"], json!([]));
    assert_eq!(page["next_cursor"], next.as_str());

    // A snapshot has everything in force.
    let page: Value = app
        .get("/v1/decisions", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let items = page["items"].as_array().unwrap();
    assert!(
        items
            .iter()
            .any(|i| i["subject"] == "ip:203.0.113.66" && i["classes"]["auth"] == 0.0),
        "{page}"
    );
    assert!(
        items
            .iter()
            .any(|i| i["kind"] == "list" && i["subject"] == "198.51.100.0/24")
    );

    let bad = app
        .get("/v1/decisions?since=not-a-cursor", Some(ADMIN_TOKEN))
        .await;
    assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

/// Two factors with different lifetimes: when the shorter one ends, the due loop
/// republishes what the longer one leaves (instead of keeping both until the longer ends).
async fn a_shorter_factor_expiring_republishes_the_longer_one(app: TestApp) {
    let dave = palisade::model::SubjectKey::user("dave", 64).unwrap();
    let now = app.now_ms();
    let scoring = &app.app.scoring;
    scoring
        .assert(
            &dave,
            palisade::scoring::Factor::scale("test", "short", 0.5, "short").until(now + 1000),
        )
        .await
        .unwrap();
    scoring
        .assert(
            &dave,
            palisade::scoring::Factor::scale("test", "long", 0.25, "long").until(now + 120_000),
        )
        .await
        .unwrap();
    let read =
        json!({"endpoint": "/v1/feed", "ip": "192.0.2.1", "user_id": "dave", "consume": false});
    let limit = |body: Value| {
        (
            body["scope"].as_str().unwrap().to_owned(),
            body["limit"].as_u64().unwrap(),
        )
    };
    // user-read is 300/min: x 0.125.
    assert_eq!(
        limit(app.limit_check(&read).await.json().await.unwrap()),
        ("user".to_owned(), 37)
    );
    app.advance(Duration::from_millis(1100)).await;
    assert_eq!(scoring.republish_due().await.unwrap(), 1);
    assert_eq!(
        limit(app.limit_check(&read).await.json().await.unwrap()),
        ("user".to_owned(), 75)
    );
    assert_eq!(scoring.republish_due().await.unwrap(), 0);
}

/// Many concurrent factor changes to one subject from two instances: whatever order the
/// publishes finish in, what the bucket reads is the combination of the final factors.
async fn concurrent_changes_from_two_instances_publish_the_latest_factors(app: TestApp) {
    // Embedded instances share nothing: there the race is between tasks of one instance.
    let second = (app.backend == Backend::Production).then_some(app.another_instance().await);
    let other = second.as_ref().unwrap_or(&app);
    let erin = palisade::model::SubjectKey::user("erin", 64).unwrap();
    let mut tasks = Vec::new();
    for i in 0..40u32 {
        let engine = if i % 2 == 0 {
            app.app.scoring.clone()
        } else {
            other.app.scoring.clone()
        };
        let subject = erin.clone();
        tasks.push(tokio::spawn(async move {
            let code = format!("c{}", i % 4);
            if i % 5 == 4 {
                engine
                    .retract(&subject, &[&format!("test:{code}")])
                    .await
                    .unwrap();
            } else {
                let value = 0.5 + f64::from(i % 7) / 10.0;
                engine
                    .assert(
                        &subject,
                        palisade::scoring::Factor::scale("test", &code, value, "race"),
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let stored = app.app.scoring.stored(&erin).await.unwrap();
    let expected =
        palisade::scoring::combine(&stored, "read", app.app.scoring.policy(), app.now_ms())
            .multiplier;
    let read =
        json!({"endpoint": "/v1/feed", "ip": "192.0.2.1", "user_id": "erin", "consume": false});
    for instance in [&app, other] {
        let body: Value = instance.limit_check(&read).await.json().await.unwrap();
        let reported = body["multiplier"].as_f64().unwrap();
        assert!(
            (reported - expected).abs() < 1e-6,
            "{reported} vs {expected} from {stored:?}"
        );
    }
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

/// `/v1/multipliers` answers are reused for one L1 TTL, but a change made through this
/// instance shows at once in the very same query.
async fn a_cached_multiplier_answer_never_outlives_a_change(app: TestApp) {
    let query = "user_id=frank&endpoint=/v1/feed";
    assert_eq!(app.multipliers(query).await["multiplier"], 1.0);
    assert_eq!(app.multipliers(query).await["multiplier"], 1.0);
    let frank = palisade::model::SubjectKey::user("frank", 64).unwrap();
    app.app
        .scoring
        .assert(
            &frank,
            palisade::scoring::Factor::scale("test", "x", 0.5, "x"),
        )
        .await
        .unwrap();
    assert_eq!(app.multipliers(query).await["multiplier"], 0.5);
    // A list entry (pulled, not published) invalidates too.
    app.post(
        "/v1/lists/deny",
        Some(ADMIN_TOKEN),
        &json!({"value": "frank", "kind": "account", "reason": "test"}),
    )
    .await;
    assert_eq!(app.multipliers(query).await["multiplier"], 0.0);
    // Bad queries are never cached as answers.
    for _ in 0..2 {
        let bad = app.get("/v1/multipliers?ip=nope", Some(ADMIN_TOKEN)).await;
        assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
}

/// Factors asserted on many subjects at once (a batch's challenges) are published as one by
/// one would: on subjects with nothing stored before and on subjects with factors (on another
/// class, or on the same class and never expiring), over more subjects than one store call
/// takes (32), and every change reaches the decision stream.
async fn factors_asserted_together_publish_as_one_by_one(app: TestApp) {
    let scoring = &app.app.scoring;
    let name = |i: usize| format!("many{i}");
    let users: Vec<palisade::model::SubjectKey> = (0..40)
        .map(|i| palisade::model::SubjectKey::user(&name(i), 64).unwrap())
        .collect();
    // 0..10 a factor on `read`, 10..20 one on `auth` (with no expiry), 20..40 nothing.
    for (i, user) in users[..20].iter().enumerate() {
        let class = if i < 10 { "read" } else { "auth" };
        scoring
            .assert(
                user,
                palisade::scoring::Factor::scale("test", "prior", 0.5, "prior")
                    .on_classes(&[class]),
            )
            .await
            .unwrap();
    }
    let cursor = app.admin_json("/v1/decisions").await["next_cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let until = app.now_ms() + 60_000;
    scoring
        .assert_many(
            users
                .iter()
                .map(|user| {
                    let factor = palisade::scoring::Factor::scale("test", "now", 0.5, "now")
                        .on_classes(&["auth"])
                        .until(until);
                    (user, factor)
                })
                .collect(),
        )
        .await
        .unwrap();
    for i in 0..users.len() {
        let read = if i < 10 { 0.5 } else { 1.0 };
        let auth = if (10..20).contains(&i) { 0.25 } else { 0.5 };
        for (endpoint, method, expected) in
            [("/v1/feed", "GET", read), ("/auth/login", "POST", auth)]
        {
            let check = json!({"endpoint": endpoint, "method": method, "ip": "192.0.2.1", "user_id": name(i), "consume": false});
            let body: Value = app.limit_check(&check).await.json().await.unwrap();
            assert_eq!(
                body["multiplier"].as_f64(),
                Some(expected),
                "{} {endpoint}: {body}",
                name(i)
            );
        }
    }
    let page = app
        .admin_json(&format!("/v1/decisions?since={cursor}"))
        .await;
    let mut changed: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["reasons"]
                .as_array()
                .is_some_and(|r| r.contains(&json!("now")))
        })
        .map(|c| c["subject"].as_str().unwrap())
        .collect();
    changed.sort_unstable();
    let mut expected: Vec<&str> = users.iter().map(|u| u.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(changed, expected, "{page}");
}

/// The same on a 3-master Redis Cluster, where the subjects' factor hashes live in different
/// slots: one subject per store call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn factors_asserted_together_publish_as_one_by_one_on_a_cluster() {
    let Some((_cluster, app)) = TestApp::on_cluster().await else {
        return;
    };
    factors_asserted_together_publish_as_one_by_one(app).await;
}

/// On Redis a subject's factor hash always has an expiry: one past its last factor's by a
/// day, or far in the future (not none) while a factor never expires, also after a factor is
/// set on it among many (the transaction gives only a new hash its expiry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_factor_hash_outlives_its_factors_and_a_lasting_one_stays() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let scoring = &app.app.scoring;
    let lasting = palisade::model::SubjectKey::user("lasting", 64).unwrap();
    let fresh = palisade::model::SubjectKey::user("fresh", 64).unwrap();
    scoring
        .assert(
            &lasting,
            palisade::scoring::Factor::scale("test", "prior", 0.5, "prior"),
        )
        .await
        .unwrap();
    let until = app.now_ms() + 60_000;
    let factor = || {
        palisade::scoring::Factor::scale("test", "now", 0.5, "now")
            .on_classes(&["auth"])
            .until(until)
    };
    scoring
        .assert_many(vec![(&lasting, factor()), (&fresh, factor())])
        .await
        .unwrap();
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let day_ms = 86_400_000;
    for (subject, at_least, at_most) in [
        (&lasting, 100 * 365 * day_ms, i64::MAX),
        (&fresh, day_ms, day_ms + 61_000),
    ] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(app.app.stores.keys.factors(subject))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((at_least..=at_most).contains(&ttl), "{subject}: PTTL {ttl}");
    }
    let check = |user: &str| json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.1", "user_id": user, "consume": false});
    for (user, expected) in [("lasting", 0.25), ("fresh", 0.5)] {
        let body: Value = app.limit_check(&check(user)).await.json().await.unwrap();
        assert_eq!(
            body["multiplier"].as_f64(),
            Some(expected),
            "{user}: {body}"
        );
    }
}
