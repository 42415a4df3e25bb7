//! Lockouts: scenario tests of the attacks they model, on both backends.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, assert_envelope};
use crate::on_both_backends;

on_both_backends!(
    brute_force_on_one_account_challenges_at_5_and_locks_at_10,
    distributed_brute_force_on_one_account_locks_it,
    password_spraying_from_one_ip_blocks_the_ip_on_auth,
    lockout_dos_cannot_lock_a_victim_out_of_a_known_device,
    repeat_lockouts_escalate_and_expire,
    release_takes_effect_at_once_and_is_audited,
    retried_batches_count_nothing_twice,
    two_instances_ingesting_one_account_create_exactly_one_lockout,
    analyst_cannot_ingest_and_ingest_cannot_release,
    a_bad_event_rejects_the_whole_batch,
    old_events_are_pruned_and_lockouts_kept,
    one_batch_decides_like_the_same_events_one_by_one,
    back_dated_failures_count_from_their_receipt,
    failures_age_out_of_the_window_and_retries_add_nothing,
    stored_events_keep_quotes_commas_newlines_and_backslashes,
    one_batch_locking_many_accounts_stores_each_lockout_with_its_own_events,
);

fn failure(id: &str, account: &str, ip: &str) -> Value {
    json!({"event_id": id, "type": "login_failure", "account": account, "ip": ip})
}

impl TestApp {
    async fn post_auth(&self, events: Vec<Value>) -> Value {
        let response = self
            .post(
                "/v1/events/auth",
                Some(ADMIN_TOKEN),
                &json!({ "events": events }),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    async fn status(&self, account: &str, ip: &str, device: Option<&str>) -> Value {
        let mut path = format!("/v1/accounts/{account}/status?ip={ip}");
        if let Some(device) = device {
            path.push_str(&format!("&device_id={device}"));
        }
        let response = self.get(&path, Some(ADMIN_TOKEN)).await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    /// `n` failures of `account`, event ids `prefix-0…`, one IP per event from `ips`, each
    /// dated 1.1 s after this app's previous one (a human's pace: these tests are not about
    /// the quick-login signal).
    async fn fail(&self, prefix: &str, account: &str, ips: &[&str], n: usize) -> Value {
        let events = (0..n)
            .map(|i| {
                let mut event = failure(&format!("{prefix}-{i}"), account, ips[i % ips.len()]);
                event["ts"] = json!(self.human_paced_ts());
                event
            })
            .collect();
        self.post_auth(events).await
    }

    /// The next of this app's event times, 1.1 s apart, starting 200 s before its clock.
    fn human_paced_ts(&self) -> String {
        static NEXT: std::sync::Mutex<Option<std::collections::HashMap<String, i64>>> =
            std::sync::Mutex::new(None);
        let slot = {
            let mut next = NEXT.lock().unwrap();
            let slots = next.get_or_insert_with(Default::default);
            let slot = slots.entry(self.base.clone()).or_insert(0);
            *slot += 1;
            *slot
        };
        chrono::DateTime::from_timestamp_millis(self.app.clock.now_ms() - 200_000 + slot * 1_100)
            .unwrap()
            .to_rfc3339()
    }

    async fn lockouts(&self, query: &str) -> Vec<Value> {
        let page: Value = self
            .get(&format!("/v1/lockouts{query}"), Some(ADMIN_TOKEN))
            .await
            .json()
            .await
            .unwrap();
        page["items"].as_array().unwrap().clone()
    }
}

/// Classic brute force: one account guessed from one IP.
async fn brute_force_on_one_account_challenges_at_5_and_locks_at_10(app: TestApp) {
    let cursor = app.admin_json("/v1/decisions").await["next_cursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let answer = app.fail("bf-a", "alice", &["203.0.113.1"], 4).await;
    assert_eq!(answer["decisions"][0]["action"], "none");
    let answer = app.fail("bf-b", "alice", &["203.0.113.1"], 1).await;
    assert_eq!(answer["decisions"][0]["action"], "challenge");
    let answer = app.fail("bf-c", "alice", &["203.0.113.1"], 5).await;
    assert_eq!(answer["decisions"][0]["action"], "lockout");
    assert!(answer["decisions"][0]["locked_until"].is_string());

    let status = app.status("alice", "203.0.113.1", None).await;
    assert_eq!(status["action"], "lockout");
    assert_eq!(status["failures_in_window"], 10);
    let lockouts = app.lockouts("?account=alice").await;
    assert_eq!(lockouts.len(), 1);
    assert_eq!(lockouts[0]["failures"], 10);
    assert_eq!(lockouts[0]["level"], 1);
    let id = lockouts[0]["id"].as_str().unwrap();
    let detail: Value = app
        .get(&format!("/v1/lockouts/{id}"), Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(detail["events"].as_array().unwrap().len(), 10);
    assert_eq!(detail["events"][0]["type"], "login_failure");
    // Enforcers following the decision stream hear of it, with its id.
    let stream = app
        .admin_json(&format!("/v1/decisions?since={cursor}"))
        .await;
    let locked: Vec<&Value> = stream["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "lockout")
        .collect();
    assert_eq!(locked.len(), 1, "{stream}");
    assert_eq!(
        (
            locked[0]["subject"].as_str(),
            locked[0]["reference"].as_str()
        ),
        (Some("user:alice"), Some(id))
    );

    // The locked account's auth budget is closed in the limiter too.
    let check = app
        .limit_check(&json!({"endpoint": "/auth/login", "method": "POST", "ip": "198.51.100.9", "user_id": "alice"}))
        .await;
    let body = assert_envelope(check, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(body["error"]["details"]["scope"], "endpoint_user");
}

/// A botnet guesses one account's password from many IPs, none of them failing often.
async fn distributed_brute_force_on_one_account_locks_it(app: TestApp) {
    let ips: Vec<String> = (1..=10).map(|i| format!("198.51.100.{i}")).collect();
    let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
    let answer = app.fail("dbf", "bob", &ips, 10).await;
    assert_eq!(answer["decisions"][0]["action"], "lockout");
    assert_eq!(
        app.status("bob", "192.0.2.200", None).await["action"],
        "lockout"
    );
}

/// Password spraying: one IP tries a common password on many accounts.
async fn password_spraying_from_one_ip_blocks_the_ip_on_auth(app: TestApp) {
    let events: Vec<Value> = (0..20)
        .map(|i| failure(&format!("spray-{i}"), &format!("user{i}"), "203.0.113.66"))
        .collect();
    app.post_auth(events).await;
    let check = app
        .limit_check(&json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.66", "user_id": "fresh-account"}))
        .await;
    let body = assert_envelope(check, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    // Every scope keyed by the IP is closed (ip-authn and auth-ip block equally long).
    let scope = body["error"]["details"]["scope"].as_str().unwrap();
    assert!(scope == "endpoint_ip" || scope == "ip", "{scope}");
    // No single account reached a lockout; other IPs are unaffected.
    assert!(app.lockouts("").await.is_empty());
    let other = app
        .limit_check(&json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.67", "user_id": "fresh-account"}))
        .await;
    assert_eq!(other.status(), StatusCode::OK);
}

/// Lockout-DoS: an attacker who knows only the victim's account name fails on purpose to lock
/// the victim out. The victim's known device and IP still get in (with a challenge).
async fn lockout_dos_cannot_lock_a_victim_out_of_a_known_device(app: TestApp) {
    app.post_auth(vec![
        json!({"event_id": "v-ok", "type": "login_success", "account": "carol",
        "ip": "192.0.2.10", "device_id": "carols-phone"}),
    ])
    .await;
    app.fail("dos", "carol", &["203.0.113.99"], 10).await;
    assert_eq!(
        app.status("carol", "203.0.113.99", None).await["action"],
        "lockout",
        "the attacker is locked out"
    );
    let from_phone = app
        .status("carol", "198.51.100.50", Some("carols-phone"))
        .await;
    assert_eq!(from_phone["action"], "challenge", "{from_phone}");
    assert_eq!(from_phone["reasons"][0]["code"], "known_context");
    assert_eq!(
        app.status("carol", "192.0.2.10", None).await["action"],
        "challenge",
        "known IP"
    );
}

/// Repeat lockouts within the decay period escalate (×2); each expires by itself.
async fn repeat_lockouts_escalate_and_expire(app: TestApp) {
    let app = TestApp::spawn_with(app.backend, |s| {
        s.lockout.base_lockout_s = 1;
        s.lockout.max_lockout_s = 60;
    })
    .await
    .unwrap();
    app.fail("esc-a", "dave", &["192.0.2.30"], 10).await;
    assert_eq!(
        app.status("dave", "192.0.2.30", None).await["action"],
        "lockout"
    );
    app.advance(Duration::from_millis(1100)).await;
    let after = app.status("dave", "192.0.2.30", None).await;
    assert_eq!(
        after["action"], "challenge",
        "expired: failures still in the window ask for a challenge"
    );
    app.fail("esc-b", "dave", &["192.0.2.30"], 1).await;
    let lockouts = app.lockouts("?account=dave&status=all").await;
    let levels: Vec<u64> = lockouts
        .iter()
        .map(|l| l["level"].as_u64().unwrap())
        .collect();
    assert_eq!(levels, vec![2, 1], "newest first");
    let second = &lockouts[0];
    let created =
        chrono::DateTime::parse_from_rfc3339(second["created_at"].as_str().unwrap()).unwrap();
    let until =
        chrono::DateTime::parse_from_rfc3339(second["locked_until"].as_str().unwrap()).unwrap();
    assert_eq!((until - created).num_milliseconds(), 2000);
    assert_eq!(app.lockouts("?account=dave&status=expired").await.len(), 1);
}

async fn release_takes_effect_at_once_and_is_audited(app: TestApp) {
    let (_, analyst) = app.create_token("analyst", "sam").await;
    let second = app.another_instance().await;
    app.fail("rel", "erin", &["192.0.2.40"], 10).await;
    let id = app.lockouts("?account=erin").await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let released = app
        .post(
            &format!("/v1/lockouts/{id}/release"),
            Some(&analyst),
            &json!({"reason": "verified by phone"}),
        )
        .await;
    assert_eq!(released.status(), StatusCode::OK);
    let released: Value = released.json().await.unwrap();
    assert_eq!(released["released_by"], "sam");
    assert_eq!(released["release_reason"], "verified by phone");
    // Every instance sharing the stores sees it (embedded: one process, the same app).
    let instance = if app.backend == Backend::Production {
        &second
    } else {
        &app
    };
    assert_eq!(
        instance.status("erin", "192.0.2.40", None).await["action"],
        "none"
    );
    let check = instance
        .limit_check(&json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.41", "user_id": "erin"}))
        .await;
    assert_eq!(check.status(), StatusCode::OK);
    assert_eq!(app.lockouts("?account=erin&status=released").await.len(), 1);
    let again = app
        .post(
            &format!("/v1/lockouts/{id}/release"),
            Some(&analyst),
            &json!({"reason": "twice"}),
        )
        .await;
    assert_envelope(again, StatusCode::CONFLICT, "CONFLICT").await;
    let missing = app
        .post(
            "/v1/lockouts/01ARZ3NDEKTSV4RRFFQ69G5FAV/release",
            Some(&analyst),
            &json!({"reason": "x"}),
        )
        .await;
    assert_envelope(missing, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    let audit: Value = app
        .get("/v1/audit?action=lockout.release", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(audit["items"][0]["actor"]["name"], "sam");
    assert_eq!(audit["items"][0]["target"], id.as_str());
}

async fn retried_batches_count_nothing_twice(app: TestApp) {
    let batch: Vec<Value> = (0..3)
        .map(|i| failure(&format!("retry-{i}"), "frank", "192.0.2.50"))
        .collect();
    let first = app.post_auth(batch.clone()).await;
    assert_eq!(
        (first["accepted"].as_u64(), first["duplicates"].as_u64()),
        (Some(3), Some(0))
    );
    let second = app.post_auth(batch).await;
    assert_eq!(
        (second["accepted"].as_u64(), second["duplicates"].as_u64()),
        (Some(0), Some(3))
    );
    assert_eq!(
        app.status("frank", "192.0.2.50", None).await["failures_in_window"],
        3
    );
    // An id repeated inside one batch is one event.
    let twice = failure("retry-twice", "frank", "192.0.2.50");
    let third = app.post_auth(vec![twice.clone(), twice]).await;
    assert_eq!(
        (third["accepted"].as_u64(), third["duplicates"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        app.status("frank", "192.0.2.50", None).await["failures_in_window"],
        4
    );
}

/// Two instances ingesting the same account's failures at the same time create one lockout.
async fn two_instances_ingesting_one_account_create_exactly_one_lockout(app: TestApp) {
    let second = match app.backend {
        Backend::Production => Some(app.another_instance().await),
        Backend::Embedded => None,
    };
    let target = second.as_ref().unwrap_or(&app);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, base) in [&app.base, &target.base, &app.base, &target.base]
        .into_iter()
        .enumerate()
    {
        let events: Vec<Value> = (0..6)
            .map(|k| failure(&format!("race-{i}-{k}"), "gina", "192.0.2.60"))
            .collect();
        let (client, url) = (app.client.clone(), format!("{base}/v1/events/auth"));
        tasks.spawn(async move {
            client
                .post(url)
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({ "events": events }))
                .send()
                .await
                .unwrap()
                .status()
        });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::OK);
    }
    assert_eq!(app.lockouts("?account=gina&status=all").await.len(), 1);
    // One alert too: a marker another instance is still storing is not taken for an orphan.
    let alerts: Value = app
        .get(
            "/v1/alerts?kind=lockout&subject=user:gina",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(alerts["items"].as_array().unwrap().len(), 1, "{alerts}");
}

async fn analyst_cannot_ingest_and_ingest_cannot_release(app: TestApp) {
    let (_, analyst) = app.create_token("analyst", "ana").await;
    let (_, ingest) = app.create_token("ingest", "auth-svc").await;
    let batch = json!({"events": [failure("role-1", "hank", "192.0.2.70")]});
    assert_envelope(
        app.post("/v1/events/auth", Some(&analyst), &batch).await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
    assert_eq!(
        app.post("/v1/events/auth", Some(&ingest), &batch)
            .await
            .status(),
        StatusCode::OK
    );
    let release = app
        .post(
            "/v1/lockouts/01ARZ3NDEKTSV4RRFFQ69G5FAV/release",
            Some(&ingest),
            &json!({"reason": "x"}),
        )
        .await;
    assert_envelope(release, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    assert_envelope(
        app.get("/v1/lockouts", Some(&ingest)).await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
    assert_eq!(
        app.get("/v1/lockouts", Some(&analyst)).await.status(),
        StatusCode::OK
    );
    let status = app
        .get("/v1/accounts/hank/status?ip=192.0.2.70", Some(&analyst))
        .await;
    assert_envelope(status, StatusCode::FORBIDDEN, "FORBIDDEN").await;
}

async fn a_bad_event_rejects_the_whole_batch(app: TestApp) {
    let batch = json!({"events": [
        failure("bad-0", "ivy", "192.0.2.80"),
        {"event_id": "bad-1", "type": "login_failure", "account": "ivy", "ip": "300.1.1.1"},
        {"event_id": "bad-2", "type": "login_failure", "account": "ivy", "ip": "192.0.2.80", "ts": "yesterday"},
    ]});
    let response = app.post("/v1/events/auth", Some(ADMIN_TOKEN), &batch).await;
    let body = assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let indexes: Vec<u64> = body["error"]["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, vec![1, 2]);
    // Malformed events (a field of the wrong type, an unknown type, an unknown field) are
    // placed too, beside an event that is well-formed but invalid.
    let malformed = json!({"events": [
        failure("bad-3", "ivy", "192.0.2.80"),
        {"event_id": "bad-4", "type": "login_failure", "account": 7, "ip": "192.0.2.80"},
        {"event_id": "bad-5", "type": "login_maybe", "account": "ivy", "ip": "192.0.2.80"},
        failure("bad-6", "ivy", "192.0.2.300"),
        {"event_id": "bad-7", "type": "login_failure", "account": "ivy", "ip": "192.0.2.80", "extra": 1},
    ]});
    let response = app
        .post("/v1/events/auth", Some(ADMIN_TOKEN), &malformed)
        .await;
    let body = assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let errors = body["error"]["details"]["errors"]
        .as_array()
        .unwrap()
        .clone();
    let indexes: Vec<u64> = errors
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, vec![1, 2, 3, 4], "{errors:?}");
    let reason = |i: usize| errors[i]["reason"].as_str().unwrap().to_owned();
    assert!(reason(0).contains("invalid type"), "{}", reason(0));
    assert!(reason(1).contains("login_maybe"), "{}", reason(1));
    assert!(reason(2).contains("not an IP address"), "{}", reason(2));
    assert!(reason(3).contains("extra"), "{}", reason(3));
    assert_eq!(
        app.status("ivy", "192.0.2.80", None).await["failures_in_window"],
        0,
        "nothing stored or counted"
    );
    let too_many: Vec<Value> = (0..1001)
        .map(|i| failure(&format!("many-{i}"), "ivy", "192.0.2.80"))
        .collect();
    let response = app
        .post(
            "/v1/events/auth",
            Some(ADMIN_TOKEN),
            &json!({ "events": too_many }),
        )
        .await;
    assert_envelope(response, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE").await;
    let empty = app
        .post(
            "/v1/events/auth",
            Some(ADMIN_TOKEN),
            &json!({ "events": [] }),
        )
        .await;
    assert_envelope(empty, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let bad_status = app
        .get("/v1/accounts/ivy/status?ip=nope", Some(ADMIN_TOKEN))
        .await;
    assert_envelope(bad_status, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let bad_list = app
        .get("/v1/lockouts?status=sleeping", Some(ADMIN_TOKEN))
        .await;
    assert_envelope(bad_list, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let bad_id = app
        .request(
            Method::GET,
            "/v1/lockouts/not-an-id",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(bad_id, StatusCode::NOT_FOUND, "NOT_FOUND").await;
}

async fn old_events_are_pruned_and_lockouts_kept(app: TestApp) {
    app.fail("prune", "jack", &["192.0.2.90"], 10).await;
    let deleted = app.app.ingest.prune_once(i64::MAX).await.unwrap();
    assert_eq!(deleted, 10);
    assert_eq!(app.lockouts("?account=jack&status=all").await.len(), 1);
}

/// A script guessing passwords faster than a human types gets a challenge after two failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_failures_faster_than_a_human_ask_for_a_challenge_on_both_backends() {
    for backend in [Backend::Embedded, Backend::Production] {
        let Some(app) = TestApp::spawn(backend).await else {
            continue;
        };
        let now = app.app.clock.now_ms();
        let at = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(now - ms)
                .unwrap()
                .to_rfc3339()
        };
        let slow = vec![
            json!({"event_id": "h1", "type": "login_failure", "account": "kim", "ip": "192.0.2.9", "ts": at(5000)}),
            json!({"event_id": "h2", "type": "login_failure", "account": "kim", "ip": "192.0.2.9", "ts": at(2000)}),
        ];
        assert_eq!(
            app.post_auth(slow).await["decisions"][0]["action"],
            "none",
            "{backend:?}"
        );
        let fast = vec![
            json!({"event_id": "h3", "type": "login_failure", "account": "kim", "ip": "192.0.2.9", "ts": at(1700)}),
        ];
        let answer = app.post_auth(fast).await;
        assert_eq!(answer["decisions"][0]["action"], "challenge", "{backend:?}");
        assert_eq!(
            answer["decisions"][0]["reasons"][0]["code"],
            "faster_than_human"
        );
    }
}

/// A batch is recorded in one hot-store call; it must decide exactly what the same events
/// posted one at a time decide: challenges, a success clearing the pair windows, spraying
/// across accounts, a lockout.
async fn one_batch_decides_like_the_same_events_one_by_one(batched: TestApp) {
    let single = TestApp::spawn(batched.backend).await.unwrap();
    let start = batched.app.clock.now_ms() - 300_000;
    let mut events = Vec::new();
    let mut event = |account: &str, ip: &str, device: Option<&str>, kind: &str| {
        let n = events.len() as i64;
        let ts = chrono::DateTime::from_timestamp_millis(start + n * 2_000)
            .unwrap()
            .to_rfc3339();
        let mut e = json!({"event_id": format!("e{n}"), "type": kind, "account": account,
            "ip": ip, "ts": ts});
        if let Some(device) = device {
            e["device_id"] = json!(device);
        }
        events.push(e);
    };
    for _ in 0..7 {
        event("amy", "198.51.100.1", Some("dev-a"), "login_failure");
    }
    event("amy", "198.51.100.1", Some("dev-a"), "login_success");
    for _ in 0..2 {
        event("amy", "198.51.100.1", Some("dev-a"), "login_failure");
    }
    for i in 0..21 {
        event(
            &format!("sprayed-{i}"),
            "203.0.113.50",
            None,
            "login_failure",
        );
    }
    for i in 0..11 {
        event("ben", &format!("192.0.2.{}", i + 1), None, "login_failure");
    }
    // One IP failing 100 times on two accounts: its `ip_failures` factor is asserted at 50
    // and again at 100 (the later one must win), and both accounts lock once.
    for i in 0..100 {
        let account = if i % 2 == 0 { "cat" } else { "dan" };
        event(account, "198.51.100.77", None, "login_failure");
    }
    let answer = batched.post_auth(events.clone()).await;
    assert_eq!(answer["accepted"], events.len());
    // The batch's own answer (every account's status in one call and one pipeline).
    let decision = |account: &str| {
        answer["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["account"] == account)
            .unwrap()["action"]
            .clone()
    };
    assert_eq!(decision("ben"), "lockout", "{answer}");
    assert_eq!(decision("amy"), "challenge", "{answer}");
    assert_eq!(decision("sprayed-0"), "none", "{answer}");
    for e in &events {
        single.post_auth(vec![e.clone()]).await;
    }
    let summary = |status: &Value| {
        let codes: Vec<&str> = status["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["code"].as_str().unwrap())
            .collect();
        (
            status["action"].clone(),
            status["failures_in_window"].clone(),
            codes.join(","),
        )
    };
    for (account, ip, device) in [
        ("amy", "198.51.100.1", Some("dev-a")),
        ("amy", "198.51.100.9", None),
        ("sprayed-3", "203.0.113.50", None),
        ("ben", "192.0.2.1", None),
    ] {
        let a = batched.status(account, ip, device).await;
        let b = single.status(account, ip, device).await;
        assert_eq!(summary(&a), summary(&b), "{account} from {ip}: {a} vs {b}");
    }
    // The success in the middle cleared amy's pair windows: 9 account failures, 2 from the pair.
    let amy = summary(&batched.status("amy", "198.51.100.1", Some("dev-a")).await);
    assert_eq!(
        amy,
        (json!("challenge"), json!(9), "account_failures".to_owned())
    );
    assert_eq!(
        batched.status("ben", "192.0.2.1", None).await["action"],
        "lockout"
    );
    assert_eq!(batched.lockouts("?account=ben").await.len(), 1);
    assert_eq!(single.lockouts("?account=ben").await.len(), 1);
    let sprayer = "/v1/multipliers?ip=203.0.113.50&endpoint=/auth/login&method=POST";
    let a: Value = batched.admin_json(sprayer).await;
    let b: Value = single.admin_json(sprayer).await;
    assert_eq!(a["multiplier"], 0.0, "{a}");
    assert_eq!(a["multiplier"], b["multiplier"]);
    // The factors each subject was given, by code and message (times differ between apps:
    // the clock runs).
    let factors = |view: &Value, key: &str| {
        let mut found: Vec<(String, String)> = view["keys"][key]["reasons"]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {view}"))
            .iter()
            .map(|r| {
                (
                    r["code"].as_str().unwrap().to_owned(),
                    // A lockout's message ends with its time ("… until <RFC 3339>").
                    r["message"]
                        .as_str()
                        .unwrap()
                        .split(" until ")
                        .next()
                        .unwrap()
                        .to_owned(),
                )
            })
            .collect();
        found.sort();
        found
    };
    for (query, key) in [
        ("ip=198.51.100.77", "ip:198.51.100.77"),
        ("ip=203.0.113.50", "ip:203.0.113.50"),
        ("ip=192.0.2.9&user_id=amy", "user:amy"),
        ("ip=192.0.2.9&user_id=cat", "user:cat"),
    ] {
        let path = format!("/v1/multipliers?{query}&endpoint=/auth/login&method=POST");
        let a: Value = batched.admin_json(&path).await;
        let b: Value = single.admin_json(&path).await;
        assert_eq!(factors(&a, key), factors(&b, key), "{key}: {a} vs {b}");
    }
    let ip = "/v1/multipliers?ip=198.51.100.77&endpoint=/auth/login&method=POST";
    let view: Value = batched.admin_json(ip).await;
    assert!(
        factors(&view, "ip:198.51.100.77").contains(&(
            "ip_failures".to_owned(),
            "100 failed logins from this IP in 10 min".to_owned()
        )),
        "{view}"
    );
    // One alert per spraying source and per lockout, however many failures crossed.
    for query in [
        "?kind=spraying&subject=ip:203.0.113.50",
        "?kind=lockout&subject=user:cat",
        "?kind=lockout&subject=user:dan",
    ] {
        for app in [&batched, &single] {
            let page: Value = app.admin_json(&format!("/v1/alerts{query}")).await;
            assert_eq!(
                page["items"].as_array().unwrap().len(),
                1,
                "{query}: {page}"
            );
        }
    }
    for account in ["cat", "dan"] {
        assert_eq!(
            batched.lockouts(&format!("?account={account}")).await.len(),
            1
        );
        assert_eq!(
            single.lockouts(&format!("?account={account}")).await.len(),
            1
        );
    }
}

/// Late-delivered failures from before the window (the auth service may send events up to
/// 24 h late) are stored but count nothing toward a challenge or lockout.
/// A backlog: the auth service's queue delivers twelve failures dated eleven minutes ago, a
/// human's pace apart. Windows count by receipt, so they lock the account now instead of
/// counting for nothing (the claimed times are kept with the events).
async fn back_dated_failures_count_from_their_receipt(app: TestApp) {
    let start = app.app.clock.now_ms() - 11 * 60_000;
    let events: Vec<Value> = (0..12)
        .map(|i| {
            let mut event = failure(&format!("late-{i}"), "latecomer", "203.0.113.77");
            event["ts"] = json!(
                chrono::DateTime::from_timestamp_millis(start + i * 2_000)
                    .unwrap()
                    .to_rfc3339()
            );
            event
        })
        .collect();
    let answer = app.post_auth(events).await;
    assert_eq!(answer["accepted"], 12, "{answer}");
    assert_eq!(answer["decisions"][0]["action"], "lockout", "{answer}");
    let status = app.status("latecomer", "203.0.113.77", None).await;
    assert_eq!(status["failures_in_window"], 12, "{status}");
    let lockouts = app.lockouts("?account=latecomer").await;
    let id = lockouts[0]["id"].as_str().unwrap();
    let detail: Value = app
        .get(&format!("/v1/lockouts/{id}"), Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let events = detail["events"].as_array().unwrap();
    assert_eq!(events.len(), 12, "{detail}");
    let first = chrono::DateTime::parse_from_rfc3339(events[0]["ts"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert_eq!(first, start, "the claimed time is kept");
}

/// A window forgets failures as they age out of it, and a batch that mixes a retried event
/// with new ones counts only the new ones. (A 4 s window: production runs on real time.)
async fn failures_age_out_of_the_window_and_retries_add_nothing(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, |s| s.lockout.window_s = 4)
        .await
        .expect("the backend of the test that asked");
    let failure_at = |id: &str, ms: i64| {
        let mut event = failure(id, "ager", "203.0.113.90");
        event["ts"] = json!(
            chrono::DateTime::from_timestamp_millis(ms)
                .unwrap()
                .to_rfc3339()
        );
        event
    };
    let t0 = app.app.clock.now_ms();
    let first: Vec<Value> = (0..3)
        .map(|i| failure_at(&format!("age-a-{i}"), t0))
        .collect();
    app.post_auth(first).await;
    app.advance(Duration::from_millis(2_500)).await;
    let t1 = app.app.clock.now_ms();
    let mut second = vec![failure_at("age-a-0", t0)];
    second.extend((0..2).map(|i| failure_at(&format!("age-b-{i}"), t1)));
    let answer = app.post_auth(second).await;
    assert_eq!(answer["accepted"], 2, "{answer}");
    let status = app.status("ager", "203.0.113.90", None).await;
    assert_eq!(status["failures_in_window"], 5, "{status}");
    // Past the first three's window, well within the later two's.
    app.advance(Duration::from_millis(2_000)).await;
    let status = app.status("ager", "203.0.113.90", None).await;
    assert_eq!(status["failures_in_window"], 2, "{status}");
    let t2 = app.app.clock.now_ms();
    app.post_auth(vec![failure_at("age-c-0", t2)]).await;
    let status = app.status("ager", "203.0.113.90", None).await;
    assert_eq!(status["failures_in_window"], 3, "{status}");
}

/// An instance that dies between setting an account's lock marker and storing the lockout
/// leaves an orphaned marker: the next failure on any instance (5 s or more after the
/// marker was set) stores the lockout under the marker's id, so an analyst sees it and can
/// release it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_lock_marker_gets_its_lockout_stored() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let account = palisade::model::SubjectKey::user("orphaned", 64).unwrap();
    let key = app.app.stores.keys.lock(&account);
    // Made a minute ago: a younger unstored marker is still being stored by its instance.
    let id = ulid::Ulid::from_datetime(std::time::SystemTime::now() - Duration::from_secs(60))
        .to_string();
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&id)
        .arg("PX")
        .arg(900_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let answer = app.fail("orphan", "orphaned", &["203.0.113.90"], 11).await;
    assert_eq!(answer["decisions"][0]["action"], "lockout", "{answer}");
    let items = app.lockouts("?account=orphaned").await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["id"], id.as_str());
    // Stored once; the marker now says so (no durable lookup for later failures).
    app.fail("orphan-more", "orphaned", &["203.0.113.90"], 3)
        .await;
    assert_eq!(app.lockouts("?account=orphaned").await.len(), 1);
    let marker: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(marker, format!("{id}!"));
}

/// A lockout's late "stored" mark or its undo never touches a marker that another lockout set
/// after a release: the marker names its own lockout until that one is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_marker_change_leaves_another_lockouts_marker_alone() {
    use palisade::lockout::velocity;
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let stores = &app.app.stores;
    let account = palisade::model::SubjectKey::user("remarked", 64).unwrap();
    let now = app.app.clock.now_ms();
    let marker = || velocity::lock_marker(&stores.hot, &stores.keys, &account, now);
    assert!(
        velocity::lock_if_absent(&stores.hot, &stores.keys, &account, "second", now, 60_000)
            .await
            .unwrap()
    );
    // The first lockout (released meanwhile) is marked stored, then undone: neither applies.
    velocity::mark_stored(&stores.hot, &stores.keys, &account, "first")
        .await
        .unwrap();
    velocity::unlock(&stores.hot, &stores.keys, &account, "first", now)
        .await
        .unwrap();
    let velocity::Marker {
        lockout_id: id,
        ttl_ms: ttl,
        stored,
    } = marker().await.unwrap().unwrap();
    assert_eq!((id.as_str(), stored), ("second", false));
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    // Its own lockout's changes apply, and the TTL is kept.
    velocity::mark_stored(&stores.hot, &stores.keys, &account, "second")
        .await
        .unwrap();
    let velocity::Marker {
        lockout_id: id,
        ttl_ms: ttl,
        stored,
    } = marker().await.unwrap().unwrap();
    assert_eq!((id.as_str(), stored), ("second", true));
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    velocity::unlock(&stores.hot, &stores.keys, &account, "second", now)
        .await
        .unwrap();
    assert_eq!(marker().await.unwrap(), None);
}

/// An instance on the production backend (single Redis) and a local 3-master Redis Cluster
/// with a connection to it (stopped when the second item is dropped); None when skipped.
async fn with_a_cluster() -> Option<(
    TestApp,
    crate::helpers::RedisCluster,
    palisade::store::RedisHot,
)> {
    let app = TestApp::spawn(Backend::Production).await?;
    let cluster = crate::helpers::RedisCluster::start().await?;
    let on_cluster = palisade::store::RedisHot::connect(&cluster.url, Duration::from_secs(5))
        .await
        .unwrap();
    Some((app, cluster, on_cluster))
}

/// The window model's specification cases (`palisade::store::window::spec`) answer the same on
/// a single Redis (the service's computation, written by `SET NX` / `lua/window_cas.lua`) and
/// on a Redis Cluster (`lua/velocity_batch.lua`) as in-process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_spec_holds_on_redis_and_on_a_cluster() {
    use palisade::lockout::velocity;
    use palisade::model::SubjectKey;
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let keys = &app.app.stores.keys;
    let on_cluster = palisade::store::Hot::Redis(on_cluster);
    for (n, case) in palisade::store::window::spec::cases()
        .into_iter()
        .enumerate()
    {
        for (store, hot) in [("redis", &app.app.stores.hot), ("cluster", &on_cluster)] {
            let mut used = Vec::new();
            for (now, steps, answers) in &case.calls {
                let steps: Vec<_> = steps
                    .iter()
                    .map(|step| {
                        let key = keys.windows(
                            &SubjectKey::user(&format!("spec-{n}-{store}-{}", step.key), 64)
                                .unwrap(),
                        );
                        used.push(key.clone());
                        palisade::store::WindowStep {
                            key,
                            ..step.clone()
                        }
                    })
                    .collect();
                let got = velocity::run_sequence(hot, &steps, *now).await.unwrap();
                assert_eq!(&got, answers, "{store}: {}", case.name);
            }
            velocity::clear(hot, &used).await.unwrap();
        }
    }
}

/// The packed window values give the same answer to every step of a long random sequence on
/// a single Redis (computed by the service, written by `SET NX` / `lua/window_cas.lua`), on a
/// Redis Cluster (`lua/velocity_batch.lua`, one call per value) and in-process: additions in
/// and out of order and outside the window, retried members, count-only steps, gaps,
/// membership checks, window deletes, caps, windows expiring while their value lives on,
/// steps batched in one call, and values that do not exist yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_steps_answer_the_same_on_redis_and_in_process() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    use rand::{Rng, SeedableRng};
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let redis = &app.app.stores.hot;
    let on_cluster = palisade::store::Hot::Redis(on_cluster);
    let memory = palisade::store::Hot::Memory(palisade::store::MemoryHot::new());
    let keys = &app.app.stores.keys;
    // Three values of 10 min windows and one of 90 days (as the known IPs/devices).
    let mut values: Vec<(String, i64)> = ["conf-a", "conf-b", "conf-c", "conf-known"]
        .iter()
        .map(|name| {
            let key = keys.windows(&SubjectKey::user(name, 64).unwrap());
            let window = if *name == "conf-known" {
                90 * 86_400_000
            } else {
                600_000
            };
            (key, window)
        })
        .collect();
    let windows = ["f", "a", "i1", "d2"];
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261203);
    let mut now = app.app.clock.now_ms();
    let mut used_scores = std::collections::HashSet::new();
    let mut checked = 0;
    for round in 0..300 {
        // Time moves on by up to 3 min between calls: windows fill, age out and expire.
        now += rng.random_range(0..180_000);
        // Every third call also meets a value nobody wrote yet.
        if round % 3 == 0 {
            let name = format!("conf-new-{round}");
            values.push((keys.windows(&SubjectKey::user(&name, 64).unwrap()), 600_000));
        }
        let batch = rng.random_range(1..12);
        let steps: Vec<Step> = (0..batch)
            .map(|_| {
                let pick = if rng.random_bool(0.3) {
                    values.len() - 1
                } else {
                    rng.random_range(0..values.len())
                };
                let (key, window_ms) = values[pick].clone();
                let window = windows[rng.random_range(0..windows.len())];
                let mut score;
                loop {
                    score = now - rng.random_range(-60_000..(window_ms.min(900_000)));
                    if used_scores.insert(score) {
                        break;
                    }
                }
                let roll = rng.random_range(0..100);
                let action = match roll {
                    0..10 => WindowAction::Delete,
                    10..22 => WindowAction::Contains,
                    22..32 => WindowAction::Remove,
                    _ => WindowAction::Record,
                };
                Step {
                    key,
                    window: window.to_owned(),
                    member: (roll % 10 != 0).then(|| rng.random_range(1..12u64)),
                    score,
                    window_ms,
                    // Small caps on two windows, so full windows drop their oldest often.
                    cap: match window {
                        "f" => 3,
                        "a" => 5,
                        _ => 1000,
                    },
                    gap: rng.random_bool(0.5),
                    action,
                }
            })
            .collect();
        let on_redis = velocity::run_sequence(redis, &steps, now).await.unwrap();
        let scripted = velocity::run_sequence(&on_cluster, &steps, now)
            .await
            .unwrap();
        let in_process = velocity::run_sequence(&memory, &steps, now).await.unwrap();
        assert_eq!(on_redis, in_process, "steps {steps:#?} at {now}");
        assert_eq!(scripted, in_process, "steps {steps:#?} at {now}");
        checked += steps.len();
    }
    assert!(checked > 1000, "{checked} steps");
    velocity::clear(
        redis,
        &values.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
    )
    .await
    .unwrap();
}

/// Instances writing the same window values at once lose nothing: a value changed between
/// the read and the write is not overwritten (`lua/window_cas.lua`); its steps run again
/// atomically (`lua/velocity_batch.lua`). Each call steps 150 values, so both kinds of script
/// call come in parts (`VALUES_PER_CALL` values each) and conflicts happen in every part.
/// Value `v` gets `10 + v % 31` members per writer (count-only steps after that), so an
/// answer given to the wrong value shows: no answer may exceed its value's final count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_window_writers_lose_no_entry() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let keys: Vec<String> = (0..150)
        .map(|v| {
            let subject = SubjectKey::user(&format!("contended-{v}"), 64).unwrap();
            app.app.stores.keys.windows(&subject)
        })
        .collect();
    let adds = |v: usize| 10 + (v % 31) as u64;
    let now = app.app.clock.now_ms();
    let step = |key: &str, member: Option<u64>, score: i64| Step {
        key: key.to_owned(),
        window: "f".to_owned(),
        member,
        score,
        window_ms: 600_000,
        cap: 1000,
        gap: false,
        action: WindowAction::Record,
    };
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..8u64 {
        let hot = app.app.stores.hot.clone();
        let keys = keys.clone();
        tasks.spawn(async move {
            let mut answers = Vec::new();
            for n in 0..40u64 {
                let score = now - 1000 + i64::try_from(n).unwrap();
                let steps: Vec<Step> = keys
                    .iter()
                    .enumerate()
                    .map(|(v, key)| {
                        let member = (n < adds(v)).then_some(writer * 1000 + n + 1);
                        step(key, member, score)
                    })
                    .collect();
                answers.push(velocity::run_sequence(&hot, &steps, now).await.unwrap());
            }
            answers
        });
    }
    let mut answered = Vec::new();
    while let Some(done) = tasks.join_next().await {
        answered.extend(done.unwrap());
    }
    let counts: Vec<Step> = keys.iter().map(|key| step(key, None, 0)).collect();
    let counted = velocity::run_sequence(&app.app.stores.hot, &counts, now)
        .await
        .unwrap();
    let expected: Vec<u32> = (0..150).map(|v| 8 * adds(v) as u32).collect();
    let finals: Vec<u32> = counted.iter().map(|c| c.0).collect();
    assert_eq!(
        finals, expected,
        "8 writers x (10 + v % 31) distinct members each"
    );
    for call in &answered {
        for (v, count) in call.iter().enumerate() {
            assert!(
                count.0 >= 1 && count.0 <= expected[v],
                "value {v} answered {} (final {})",
                count.0,
                expected[v]
            );
        }
    }
    velocity::clear(&app.app.stores.hot, &keys).await.unwrap();
}

/// A window value not in the packed layout (a foreign writer, a corrupted value) reads as
/// empty on every path, the script included (on a cluster every window runs through it), and
/// is replaced by the next write: an answer, not a 5xx.
#[tokio::test]
async fn a_value_not_in_the_window_layout_reads_as_empty() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    use palisade::store::Hot;
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let now = app.app.clock.now_ms();
    for (n, hot) in [&app.app.stores.hot, &Hot::Redis(on_cluster.clone())]
        .into_iter()
        .enumerate()
    {
        let Hot::Redis(redis) = hot else {
            panic!("Redis");
        };
        // A window header cut short, and a header announcing 9 entries that are not there.
        let garbled = [
            [&[1u8, b'f'][..], &[0x42; 5]].concat(),
            [&[1u8, b'f'][..], &[0x42; 8], &[0, 0, 0, 9], b"short"].concat(),
        ];
        for (g, garbage) in garbled.into_iter().enumerate() {
            let key = app
                .app
                .stores
                .keys
                .windows(&SubjectKey::user(&format!("garbled-{n}-{g}"), 64).unwrap());
            let _: redis::Value = redis
                .query(redis::cmd("SET").arg(&key).arg(garbage))
                .await
                .unwrap();
            let step = Step {
                key: key.clone(),
                window: "f".to_owned(),
                member: Some(7),
                score: now - 1000,
                window_ms: 600_000,
                cap: 1000,
                gap: false,
                action: WindowAction::Record,
            };
            let counted = velocity::run_sequence(hot, std::slice::from_ref(&step), now)
                .await
                .unwrap_or_else(|e| panic!("backend {n}, value {g}: {e}"));
            assert_eq!(
                counted[0].0, 1,
                "backend {n}, value {g}: the garbage counts nothing"
            );
            let more = [8, 9, 10].map(|m| Step {
                member: Some(m),
                ..step.clone()
            });
            let again = velocity::run_sequence(hot, &more, now).await.unwrap();
            let counts: Vec<u32> = again.iter().map(|c| c.0).collect();
            assert_eq!(
                counts,
                [2, 3, 4],
                "backend {n}, value {g}: the value was replaced"
            );
            velocity::clear(hot, &[key]).await.unwrap();
        }
    }
}

/// A distributed brute force (one account failing from many IPs: a pair window per IP) keeps
/// the account's value bounded, with the same answers on a single Redis, a Redis Cluster
/// (the script) and in-process: after each call at most `MAX_WINDOWS_PER_KIND` pair
/// windows, the ones added to least recently dropped first (also with many new ones in one
/// call), windows whose entries aged out dropped before any live one, the account's own
/// window never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_pair_windows_keep_an_account_value_bounded() {
    use palisade::lockout::velocity::{self, Step, WindowAction};
    use palisade::model::SubjectKey;
    use palisade::store::{Hot, MAX_WINDOWS_PER_KIND, MemoryHot};
    let Some((app, _cluster, on_cluster)) = with_a_cluster().await else {
        return;
    };
    let backends = [
        app.app.stores.hot.clone(),
        Hot::Redis(on_cluster),
        Hot::Memory(MemoryHot::new()),
    ];
    let key = app
        .app
        .stores
        .keys
        .windows(&SubjectKey::user("botnet-target", 64).unwrap());
    let window_ms = 600_000;
    let step = |window: String, member: Option<u64>, score: i64| Step {
        key: key.clone(),
        window,
        member,
        score,
        window_ms,
        cap: if member.is_some() { 10 } else { 1000 },
        gap: false,
        action: WindowAction::Record,
    };
    // A failure from IP n: the account's window and the pair window `i{n:03}`.
    let failure = |n: u64, score: i64| {
        [
            Step {
                cap: 1000,
                ..step("f".to_owned(), Some(n), score)
            },
            step(format!("i{n:03}"), Some(n), score),
        ]
    };
    let start = app.app.clock.now_ms();
    // (now, steps) per call: 200 IPs one call each, 1 ms apart; then 100 new IPs in one call.
    let mut calls: Vec<(i64, Vec<Step>)> = (0..200)
        .map(|n| (start + n as i64, failure(n, start + n as i64).to_vec()))
        .collect();
    calls.push((
        start + 300,
        (200..300).flat_map(|n| failure(n, start + 300)).collect(),
    ));
    // One call per window: the account's, then `i000` … `i499`.
    let counts_at = |now: i64| {
        std::iter::once(step("f".to_owned(), None, 0))
            .chain((0..500).map(|n| step(format!("i{n:03}"), None, 0)))
            .map(|s| (now, vec![s]))
            .collect::<Vec<_>>()
    };
    let device_windows: Vec<String> = (0..150)
        .map(|n| velocity::pair_window('d', &SubjectKey::device(&format!("dev{n}"), 64).unwrap()))
        .collect();
    // Per backend, per call: the call's window counts.
    let mut answers: Vec<Vec<velocity::WindowCounts>> = vec![Vec::new(); 3];
    let mut sizes: Vec<Vec<usize>> = vec![Vec::new(); 3];
    for (b, hot) in backends.iter().enumerate() {
        let run = |calls: Vec<(i64, Vec<Step>)>| async move {
            let mut out = Vec::new();
            for (now, steps) in calls {
                out.push(velocity::run_sequence(hot, &steps, now).await.unwrap());
            }
            out
        };
        let size = || async {
            let Hot::Redis(redis) = hot else {
                return None;
            };
            let len: usize = redis.query(redis::cmd("STRLEN").arg(&key)).await.unwrap();
            Some(len)
        };
        answers[b].extend(run(calls.clone()).await);
        answers[b].extend(run(counts_at(start + 300)).await);
        sizes[b].extend(size().await);
        // Then 128 IPs whose failures are 1 ms from leaving the window, and 2 ms later one
        // more IP.
        let late = start + 400;
        let fading: Vec<Step> = (300..428)
            .flat_map(|n| failure(n, late - window_ms + 1))
            .collect();
        answers[b].extend(run(vec![(late, fading)]).await);
        answers[b].extend(run(vec![(late + 2, failure(499, late + 2).to_vec())]).await);
        answers[b].extend(run(counts_at(late + 2)).await);
        sizes[b].extend(size().await);
        // One call whose steps alternate between this value and another (as a batch's
        // account and IP values do): 150 new windows of another kind, counted in the same
        // call and in the next. Every path (a cluster too, one script call per value) ends
        // the value's call after its last step, so the trim comes between the two.
        let interleaved: Vec<Step> = (0..150)
            .flat_map(|n| {
                let mut other = step("a".to_owned(), Some(n), late + 3);
                other.key = format!("{key}-other");
                [step(format!("j{n:03}"), Some(n), late + 3), other]
            })
            .chain((0..150).map(|n| step(format!("j{n:03}"), None, 0)))
            .collect();
        let count_j: Vec<Step> = (0..150)
            .map(|n| step(format!("j{n:03}"), None, 0))
            .collect();
        answers[b].extend(run(vec![(late + 3, interleaved), (late + 3, count_j)]).await);
        // 150 device pair windows with real names (kind and 16 hex digits, which the script
        // orders numerically) in one call, then counted.
        let devices: Vec<Step> = device_windows
            .iter()
            .map(|w| step(w.clone(), Some(7), late + 4))
            .collect();
        let count_devices: Vec<Step> = device_windows
            .iter()
            .map(|w| step(w.clone(), None, 0))
            .collect();
        answers[b].extend(run(vec![(late + 4, devices), (late + 4, count_devices)]).await);
        velocity::clear(hot, &[key.clone(), format!("{key}-other")])
            .await
            .unwrap();
    }
    assert_eq!(answers[0], answers[2], "single Redis vs in-process");
    assert_eq!(answers[1], answers[2], "cluster (script) vs in-process");
    // After 300 IPs: the 100 of the last call and the 28 newest before them, 128 in all.
    let first_counts = &answers[2][calls.len()..calls.len() + 501];
    assert_eq!(
        first_counts[0][0].0, 300,
        "the account's own window keeps every failure"
    );
    let live: Vec<usize> = (0..500)
        .filter(|&n| first_counts[1 + n][0].0 == 1)
        .collect();
    assert_eq!(live.len(), MAX_WINDOWS_PER_KIND);
    assert_eq!(live, (172..300).collect::<Vec<_>>());
    // Each pair window: byte #name, 4-byte name, expiry and count (12), one 16-byte entry;
    // the account's window: 1 + 1 + 12, then 16 per failure.
    let bytes = |pairs: usize, failures: usize| pairs * (1 + 4 + 12 + 16) + 14 + 16 * failures;
    assert_eq!(
        sizes[0][0],
        bytes(MAX_WINDOWS_PER_KIND, 300),
        "single Redis"
    );
    assert_eq!(sizes[1][0], bytes(MAX_WINDOWS_PER_KIND, 300), "cluster");
    // The 150 windows added in one call all count in it; the end of the call kept the 128
    // with the largest names (equal expiry): `j022` … `j149`.
    let [interleaved, next, _, devices_next] = answers[2].last_chunk::<4>().unwrap();
    assert!(interleaved[300..].iter().all(|c| c.0 == 1));
    let live_j: Vec<usize> = (0..150).filter(|&n| next[n].0 == 1).collect();
    assert_eq!(live_j, (22..150).collect::<Vec<_>>());
    // The same with real pair-window names: the 128 largest, bytewise.
    let mut by_name: Vec<&String> = device_windows.iter().collect();
    by_name.sort();
    let kept: std::collections::HashSet<&String> = by_name[22..].iter().copied().collect();
    let live_devices: Vec<bool> = devices_next.iter().map(|c| c.0 == 1).collect();
    let expected: Vec<bool> = device_windows.iter().map(|w| kept.contains(w)).collect();
    assert_eq!(live_devices, expected);
    // The 128 fading windows aged out 1 ms later: the next new window dropped them all.
    let last_counts = &answers[2][answers[2].len() - 505..answers[2].len() - 4];
    let live_late: Vec<usize> = (0..500).filter(|&n| last_counts[1 + n][0].0 == 1).collect();
    assert_eq!(live_late, [499]);
    // The account's window: the 300 failures of the first calls (in range), the fading ones
    // aged out, the last one.
    assert_eq!(last_counts[0][0].0, 301);
    assert_eq!(sizes[0][1], bytes(1, 301), "single Redis, late");
    assert_eq!(sizes[1][1], bytes(1, 301), "cluster, late");
}

/// A pair (account+IP) window keeps only as many failures as the thresholds need, so one IP
/// hammering an account does not grow its value: 40 failures from one IP store 40 entries in
/// the account's window and `lockout_after` (10) in the pair window.
#[tokio::test]
async fn a_pair_window_keeps_only_what_the_thresholds_need() {
    use palisade::model::SubjectKey;
    use palisade::store::Hot;
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let events = (0..40)
        .map(|i| failure(&format!("pair-cap-{i}"), "hammered", "203.0.113.40"))
        .collect();
    app.post_auth(events).await;
    let Hot::Redis(redis) = &app.app.stores.hot else {
        panic!("production backend");
    };
    let key = app
        .app
        .stores
        .keys
        .windows(&SubjectKey::user("hammered", 256).unwrap());
    let len: usize = redis.query(redis::cmd("STRLEN").arg(&key)).await.unwrap();
    // Per window: byte #name, the name ("f"; "i" and 16 hex digits; "q"), expiry and count
    // (12), then 16 bytes per entry; the quick-login window keeps its 16 newest.
    assert_eq!(
        len,
        (1 + 1 + 12 + 16 * 40) + (1 + 17 + 12 + 16 * 10) + (1 + 1 + 12 + 16 * 16)
    );
}

/// Events are stored exactly as sent, whatever their text holds (written for a `COPY … CSV`
/// insert, kept for the one used): a lockout's events read back the account, device and
/// endpoint unchanged.
async fn stored_events_keep_quotes_commas_newlines_and_backslashes(app: TestApp) {
    let account = r#"o'brien, "jr" \ é"#;
    let device = "dev,\"1\"\\.";
    let endpoint = "/login?a=1,\"b\"\n\\.\nnext line";
    let events: Vec<Value> = (0..10)
        .map(|i| {
            let mut event = failure(&format!("odd-{i}"), account, "203.0.113.77");
            event["device_id"] = json!(device);
            event["endpoint"] = json!(if i % 2 == 0 { Some(endpoint) } else { None });
            event
        })
        .collect();
    let answer = app.post_auth(events).await;
    assert_eq!(answer["accepted"], 10, "{answer}");
    assert_eq!(answer["decisions"][0]["action"], "lockout", "{answer}");
    let lockouts = app.lockouts("").await;
    let lockout = lockouts
        .iter()
        .find(|l| l["account"] == account)
        .expect("the lockout of the odd account");
    let detail: Value = app
        .get(
            &format!("/v1/lockouts/{}", lockout["id"].as_str().unwrap()),
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    let events = detail["events"].as_array().unwrap();
    assert_eq!(events.len(), 10, "{detail}");
    for event in events {
        assert_eq!(event["account"], account);
        assert_eq!(event["device_id"], device);
        let n: usize = event["event_id"].as_str().unwrap()[4..].parse().unwrap();
        if n.is_multiple_of(2) {
            assert_eq!(event["endpoint"], endpoint, "{event}");
        } else {
            assert!(event["endpoint"].is_null(), "{event}");
        }
    }
}

/// A batch that tips several accounts over the lockout threshold at once (a credential-stuffing
/// wave): each account gets one lockout (stored together), listing its own failures only, and
/// each is locked in its status; the batch retried adds nothing.
async fn one_batch_locking_many_accounts_stores_each_lockout_with_its_own_events(app: TestApp) {
    let accounts = ["wave-a", "wave-b", "wave-c", "wave-d"];
    let events: Vec<Value> = (0..10)
        .flat_map(|i| {
            accounts
                .iter()
                .map(move |account| failure(&format!("{account}-{i}"), account, "203.0.113.40"))
        })
        .collect();
    let answer = app.post_auth(events.clone()).await;
    assert_eq!(answer["accepted"], 40, "{answer}");
    for decision in answer["decisions"].as_array().unwrap() {
        assert_eq!(decision["action"], "lockout", "{answer}");
    }
    let lockouts = app.lockouts("").await;
    for account in accounts {
        let mine: Vec<&Value> = lockouts
            .iter()
            .filter(|l| l["account"] == account)
            .collect();
        assert_eq!(mine.len(), 1, "{lockouts:?}");
        assert_eq!(mine[0]["failures"], 10);
        let detail = app
            .admin_json(&format!("/v1/lockouts/{}", mine[0]["id"].as_str().unwrap()))
            .await;
        let events = detail["events"].as_array().unwrap();
        assert_eq!(events.len(), 10, "{detail}");
        assert!(events.iter().all(|e| e["account"] == account), "{detail}");
        let status = app.status(account, "198.51.100.1", None).await;
        assert_eq!(status["action"], "lockout", "{status}");
        // One alert each (the batch's alerts are stored together), naming its lockout.
        let alerts = app
            .admin_json(&format!("/v1/alerts?kind=lockout&subject=user:{account}"))
            .await;
        let alerts = alerts["items"].as_array().unwrap();
        assert_eq!(alerts.len(), 1, "{alerts:?}");
        assert_eq!(alerts[0]["details"]["lockout_id"], mine[0]["id"]);
    }
    let answer = app.post_auth(events).await;
    assert_eq!(answer["duplicates"], 40, "{answer}");
    assert_eq!(app.lockouts("").await.len(), accounts.len());
    let alerts = app.admin_json("/v1/alerts?kind=lockout").await;
    assert_eq!(alerts["items"].as_array().unwrap().len(), accounts.len());
}

/// Brute force, challenge and lockout on a 3-master Redis Cluster (windows, markers, factors
/// and the decision stream in different slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brute_force_locks_on_a_cluster() {
    let Some((_cluster, app)) = TestApp::on_cluster().await else {
        return;
    };
    brute_force_on_one_account_challenges_at_5_and_locks_at_10(app).await;
}

/// `lua/window_cas.lua` writes a value only if it is still as read: one changed meanwhile
/// keeps its content, one deleted meanwhile stays deleted, and both are reported (for
/// `velocity_batch.lua` to run their steps); an unchanged one takes the new value and TTL.
#[tokio::test]
async fn window_cas_writes_only_values_unchanged_since_read() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let key = |name: &str| format!("{}:cas-test:{name}", app.settings.store.redis_key_prefix);
    let (same, changed, gone, deleted) = (key("same"), key("changed"), key("gone"), key("del"));
    for (k, v) in [(&same, "a"), (&changed, "theirs"), (&deleted, "d")] {
        let _: () = redis::cmd("SET")
            .arg(k)
            .arg(v)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("DEL")
        .arg(&gone)
        .query_async(&mut conn)
        .await
        .unwrap();
    let failed: Vec<usize> = redis::Script::new(include_str!("../../lua/window_cas.lua"))
        .key(&same)
        .key(&changed)
        .key(&gone)
        .key(&deleted)
        .arg("a")
        .arg("a2")
        .arg(120_000)
        .arg("mine")
        .arg("mine2")
        .arg(120_000)
        .arg("was")
        .arg("was2")
        .arg(120_000)
        .arg("d")
        .arg("")
        .arg(0)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        failed,
        vec![2, 3],
        "the changed and the deleted values conflict"
    );
    let values: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&same)
        .arg(&changed)
        .arg(&gone)
        .arg(&deleted)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        values,
        vec![Some("a2".to_owned()), Some("theirs".to_owned()), None, None]
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&same)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 60_000, "the written value has the new TTL ({ttl} ms)");
    let _: () = redis::cmd("DEL")
        .arg(&same)
        .arg(&changed)
        .query_async(&mut conn)
        .await
        .unwrap();
}
