//! Auth-event ingest as the lockout model sees it: retries, batches, receipt time, ageing,
//! pruning, stored text and lock markers, on both backends.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, assert_envelope};
use crate::lockout::failure;
use crate::on_both_backends;

mod markers; // lock markers: orphans adopted, a late change leaves another lockout's alone

on_both_backends!(
    retried_batches_count_nothing_twice,
    a_bad_event_rejects_the_whole_batch,
    old_events_are_pruned_and_lockouts_kept,
    one_batch_decides_like_the_same_events_one_by_one,
    back_dated_failures_count_from_their_receipt,
    failures_age_out_of_the_window_and_retries_add_nothing,
    stored_events_keep_quotes_commas_newlines_and_backslashes,
    one_batch_locking_many_accounts_stores_each_lockout_with_its_own_events,
);

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
