//! Lockouts: scenario tests of the attacks they model, on both backends.
use std::time::Duration;

use reqwest::StatusCode;

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
    two_instances_ingesting_one_account_create_exactly_one_lockout,
    analyst_cannot_ingest_and_ingest_cannot_release,
);

pub(crate) fn failure(id: &str, account: &str, ip: &str) -> Value {
    json!({"event_id": id, "type": "login_failure", "account": account, "ip": ip})
}

impl TestApp {
    pub(crate) async fn post_auth(&self, events: Vec<Value>) -> Value {
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

    pub(crate) async fn status(&self, account: &str, ip: &str, device: Option<&str>) -> Value {
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
    pub(crate) async fn fail(&self, prefix: &str, account: &str, ips: &[&str], n: usize) -> Value {
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
    pub(crate) fn human_paced_ts(&self) -> String {
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

    pub(crate) async fn lockouts(&self, query: &str) -> Vec<Value> {
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

/// Brute force, challenge and lockout on a 3-master Redis Cluster (windows, markers, factors
/// and the decision stream in different slots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn brute_force_locks_on_a_cluster() {
    let Some((_cluster, app)) = TestApp::on_cluster().await else {
        return;
    };
    brute_force_on_one_account_challenges_at_5_and_locks_at_10(app).await;
}
