//! Redis is a cache, the durable store the truth: what enforcement holds in the hot store
//! (lock markers, factors, windows, known contexts) comes back after the hot store lost it,
//! on both backends (embedded: a restart, whose in-process hot store starts empty), and with
//! the real binary when Redis restarts without persistence under two instances.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    ADMIN_TOKEN, Backend, OwnRedis, Process, TestApp, assert_envelope, free_port, metric_value,
    production_urls,
};
use crate::lockout::failure;
use crate::on_both_backends;

on_both_backends!(
    enforcement_survives_losing_the_hot_store,
    a_blocked_network_stays_blocked_after_the_hot_store_is_lost,
);

/// Makes the hot store lose this deployment's data: every key under its prefix deleted (as
/// `FLUSHALL` does, without touching the other tests' keys), then the epoch check that every
/// instance runs each second; embedded, a restart (a new instance on the same SQLite file).
/// Returns the instance to ask afterwards.
async fn lose_hot_store(app: &TestApp) -> Option<TestApp> {
    match app.backend {
        Backend::Embedded => Some(app.another_instance().await),
        Backend::Production
            if let Some(nodes) = app
                .settings
                .redis_url
                .as_deref()
                .and_then(|url| url.strip_prefix("redis+cluster://")) =>
        {
            // A cluster of this test's own: every master emptied.
            for node in nodes.split(',') {
                let client = redis::Client::open(format!("redis://{node}")).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
            }
            let phase = app.app.recovery.check().await.expect("rebuild");
            assert_eq!(phase, palisade::recovery::Phase::Current);
            None
        }
        Backend::Production => {
            let client = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let pattern = format!("{}:*", app.settings.store.redis_key_prefix);
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if !keys.is_empty() {
                    let _: () = redis::cmd("DEL")
                        .arg(&keys)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            let phase = app.app.recovery.check().await.expect("rebuild");
            assert_eq!(phase, palisade::recovery::Phase::Current);
            None
        }
    }
}

async fn auth_check(app: &TestApp, ip: &str, user: &str) -> reqwest::Response {
    app.limit_check(
        &json!({"endpoint": "/auth/login", "method": "POST", "ip": ip, "user_id": user}),
    )
    .await
}

/// A lockout, a released lockout, a spraying IP, a half-full window and a known device, then
/// the hot store loses everything: each is enforced as before, nothing is counted twice and
/// the analyst API agrees with enforcement for every account.
async fn enforcement_survives_losing_the_hot_store(app: TestApp) {
    app.post_auth(vec![
        json!({"event_id": "carol-ok", "type": "login_success",
        "account": "carol", "ip": "192.0.2.10", "device_id": "carols-phone"}),
    ])
    .await;
    app.fail("lost-alice", "alice", &["203.0.113.1"], 10).await;
    app.fail("lost-carol", "carol", &["203.0.113.99"], 10).await;
    app.fail("lost-erin", "erin", &["203.0.113.3"], 10).await;
    app.fail("lost-dave", "dave", &["203.0.113.2"], 8).await;
    let spray: Vec<Value> = (0..20)
        .map(|i| {
            failure(
                &format!("lost-spray-{i}"),
                &format!("user{i}"),
                "203.0.113.66",
            )
        })
        .collect();
    app.post_auth(spray).await;
    let erin = app.lockouts("?account=erin").await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let released = app
        .post(
            &format!("/v1/lockouts/{erin}/release"),
            Some(ADMIN_TOKEN),
            &json!({"reason": "verified"}),
        )
        .await;
    assert_eq!(released.status(), StatusCode::OK);
    let rebuilds_before = app.app.recovery.state().last_rebuild;
    let cursor = app.admin_json("/v1/decisions").await["next_cursor"]
        .as_str()
        .unwrap()
        .to_owned();

    let restarted = lose_hot_store(&app).await;
    let after = restarted.as_ref().unwrap_or(&app);
    let rebuilt = after
        .app
        .recovery
        .state()
        .last_rebuild
        .expect("a rebuild ran");
    assert_ne!(Some(rebuilt), rebuilds_before);
    assert_eq!(rebuilt.lockouts, 2, "alice and carol: {rebuilt:?}");

    // The lockout holds at the limiter and in the status, and no new lockout is made.
    let check = auth_check(after, "198.51.100.9", "alice").await;
    let body = assert_envelope(check, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(body["error"]["details"]["scope"], "endpoint_user");
    let status = after.status("alice", "203.0.113.1", None).await;
    assert_eq!(status["action"], "lockout", "{status}");
    assert_eq!(status["failures_in_window"], 10, "{status}");
    after
        .fail("lost-alice-more", "alice", &["203.0.113.1"], 3)
        .await;
    assert_eq!(after.lockouts("?account=alice").await.len(), 1);
    // The spraying IP stays blocked on auth; another IP does not.
    let sprayer = auth_check(after, "203.0.113.66", "fresh-account").await;
    assert_eq!(sprayer.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = auth_check(after, "203.0.113.67", "fresh-account").await;
    assert_eq!(other.status(), StatusCode::OK);
    // The account status tells the auth service about the IP too.
    let from_sprayer = after.status("fresh-account", "203.0.113.66", None).await;
    assert_eq!(
        from_sprayer["ip_signals"]["multiplier"], 0.0,
        "{from_sprayer}"
    );
    assert!(
        from_sprayer["ip_signals"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "spraying"),
        "{from_sprayer}"
    );
    let from_other = after.status("fresh-account", "203.0.113.67", None).await;
    assert_eq!(from_other["ip_signals"]["multiplier"], 1.0, "{from_other}");
    // The lockout-DoS rule still knows carol's phone: a challenge, not a lockout.
    let phone = after
        .status("carol", "198.51.100.50", Some("carols-phone"))
        .await;
    assert_eq!(phone["action"], "challenge", "{phone}");
    assert_eq!(
        after.status("carol", "203.0.113.99", None).await["action"],
        "lockout"
    );
    // The released account's failures before its release do not come back (the sprayer's
    // /24 is suspected, which asks a context erin does not know for a step-up: nothing of
    // erin's own).
    let erin_status = after.status("erin", "203.0.113.3", None).await;
    assert_eq!(erin_status["failures_in_window"], 0, "{erin_status}");
    assert!(
        erin_status["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["code"] == "network_spraying"),
        "{erin_status}"
    );
    // The half-full window is as full as before: two more failures lock (no fresh budget).
    let dave = after
        .fail("lost-dave-more", "dave", &["203.0.113.2"], 2)
        .await;
    assert_eq!(dave["decisions"][0]["action"], "lockout", "{dave}");
    // The analyst API and enforcement agree on every account with a lockout.
    for lockout in after.lockouts("?status=all").await {
        let account = lockout["account"].as_str().unwrap();
        let active = lockout["released_at"].is_null();
        let check = auth_check(after, "198.51.100.77", account).await;
        assert_eq!(
            check.status() == StatusCode::TOO_MANY_REQUESTS,
            active,
            "{account}: {lockout}"
        );
    }
    // A follower of the decision stream from before the loss starts over from a snapshot
    // (what changed in between is not in the new stream), which holds the lockouts.
    let resumed = after
        .admin_json(&format!("/v1/decisions?since={cursor}"))
        .await;
    assert_eq!(resumed["snapshot"], true, "{resumed}");
    assert!(
        resumed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["subject"] == "user:alice"),
        "{resumed}"
    );
    let ready = after.get("/readyz", None).await;
    assert_eq!(ready.status(), StatusCode::OK);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["hot_state"]["phase"], "current", "{ready}");
    assert_eq!(ready["hot_state"]["last_rebuild"]["lockouts"], 2, "{ready}");
}

/// While another instance holds the rebuild lease, lockouts are not back yet: classes that
/// fail closed do (503, as when Redis is down), the others answer; once the epoch is back,
/// the lockout refuses again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn auth_fails_closed_until_the_rebuild_brings_lockouts_back() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    app.fail("wait-alice", "alice", &["203.0.113.1"], 10).await;
    let client = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys = &app.app.stores.keys;
    let _: () = redis::cmd("DEL")
        .arg(keys.epoch())
        .arg(keys.lock(&palisade::model::SubjectKey::user("alice", 64).unwrap()))
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(keys.rebuild_lease())
        .arg("another-instance")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let phase = app.app.recovery.check().await.unwrap();
    assert_eq!(phase, palisade::recovery::Phase::Waiting);
    let auth = auth_check(&app, "198.51.100.9", "someone").await;
    assert_eq!(
        auth.headers()
            .get("x-palisade-degraded")
            .and_then(|v| v.to_str().ok()),
        Some("redis-unavailable")
    );
    assert_envelope(auth, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
    let read = app
        .limit_check(&json!({"endpoint": "/v1/feed", "ip": "198.51.100.9", "user_id": "someone"}))
        .await;
    assert_eq!(read.status(), StatusCode::OK);
    let ready: Value = app.get("/readyz", None).await.json().await.unwrap();
    assert_eq!(ready["hot_state"]["phase"], "waiting", "{ready}");

    // The other instance is gone: its lease runs out, this one rebuilds.
    let _: () = redis::cmd("DEL")
        .arg(keys.rebuild_lease())
        .query_async(&mut conn)
        .await
        .unwrap();
    let phase = app.app.recovery.check().await.unwrap();
    assert_eq!(phase, palisade::recovery::Phase::Current);
    let check = auth_check(&app, "198.51.100.10", "alice").await;
    let body = assert_envelope(check, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(body["error"]["details"]["limit"], 0, "{body}");
    assert_eq!(
        auth_check(&app, "198.51.100.11", "someone").await.status(),
        StatusCode::OK
    );
}

/// The same on a local 3-master Redis Cluster whose every master is emptied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn enforcement_survives_a_redis_cluster_losing_its_data() {
    let Some((_cluster, app)) = TestApp::on_cluster().await else {
        return;
    };
    enforcement_survives_losing_the_hot_store(app).await;
}

impl Process {
    /// `palisade_hot_rebuilds_total{outcome="done"}` of this process.
    async fn rebuilds(&self) -> u64 {
        let text = reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metric_value(&text, r#"palisade_hot_rebuilds_total{outcome="done"}"#) as u64
    }
}

/// Two instances of the real binary share a Redis that is killed and comes back empty: every
/// lockout is enforced again by both within 10 s, and exactly one instance rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn two_instances_reenforce_every_lockout_after_redis_restarts_empty() {
    let Some((db_url, _)) = production_urls() else {
        return;
    };
    let redis = OwnRedis::start(free_port(), tempfile::tempdir().unwrap()).await;
    let database = crate::helpers::fresh_postgres(&db_url).await;
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("PALISADE_DATABASE_URL", database),
        (
            "PALISADE_REDIS_URL",
            format!("redis://127.0.0.1:{}", redis.port),
        ),
        ("PALISADE_BOOTSTRAP_TOKEN", ADMIN_TOKEN.to_owned()),
        ("PALISADE_DATA_DIR", data.path().display().to_string()),
        // Every answer from the hot store, none from the L1 cache of blocked buckets.
        ("PALISADE_LIMITS__L1_TTL_MS", "0".to_owned()),
        // 1,000 failures and no success would turn the login guard on, and it would refuse
        // the control accounts below (new contexts): this test is about lockouts alone.
        ("PALISADE_LOCKOUT__STUFFING__MIN_FAILURES", "0".to_owned()),
    ];
    let first = Process::start(&env).await;
    let second = Process::start(&env).await;
    let client = reqwest::Client::new();
    // 100 accounts, 10 failures each: every one locks.
    let accounts: Vec<String> = (0..100).map(|i| format!("victim-{i}")).collect();
    for chunk in accounts.chunks(25) {
        let events: Vec<Value> = chunk
            .iter()
            .flat_map(|account| {
                (0..10).map(move |i| {
                    failure(
                        &format!("{account}-{i}"),
                        account,
                        &format!("10.7.0.{}", i + 1),
                    )
                })
            })
            .collect();
        let response = client
            .post(format!("{}/v1/events/auth", first.base))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "events": events }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // How many of `accounts` are refused on auth by a lockout, each asked from an IP of its
    // own in round `round` (no per-IP budget runs out on the way).
    let enforced = |base: String, client: reqwest::Client, accounts: Vec<String>, round: usize| async move {
        let mut refused = 0;
        for (i, account) in accounts.iter().enumerate() {
            let ip = format!("10.{}.{}.{}", 100 + round % 100, i / 250, i % 250 + 1);
            let check = client
                .post(format!("{base}/v1/limit/check"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({"endpoint": "/auth/login", "method": "POST", "ip": ip, "user_id": account}))
                .send()
                .await;
            // Refused by the lockout (its multiplier 0 closes the budget), not by an
            // account budget these rounds of checks used up.
            if let Ok(r) = check
                && r.status() == StatusCode::TOO_MANY_REQUESTS
                && r.json::<Value>().await.unwrap()["error"]["details"]["limit"] == 0
            {
                refused += 1;
            }
        }
        refused
    };
    for (round, process) in [&first, &second].into_iter().enumerate() {
        assert_eq!(
            enforced(
                process.base.clone(),
                client.clone(),
                accounts.clone(),
                round
            )
            .await,
            100
        );
    }
    let rebuilds_before = first.rebuilds().await + second.rebuilds().await;

    let redis = redis.restart_empty().await;
    let lost = Instant::now();
    let mut seconds = None;
    for round in 2.. {
        if lost.elapsed() > Duration::from_secs(20) {
            break;
        }
        let (a, b) = tokio::join!(
            enforced(first.base.clone(), client.clone(), accounts.clone(), round),
            enforced(
                second.base.clone(),
                client.clone(),
                accounts.clone(),
                round + 50
            ),
        );
        // Accounts never locked pass on both: the refusals are the lockouts', not a hot
        // store that is down failing closed.
        let control = vec![format!("never-locked-{round}")];
        let (c1, c2) = tokio::join!(
            enforced(first.base.clone(), client.clone(), control.clone(), round),
            enforced(second.base.clone(), client.clone(), control, round + 50),
        );
        if a == 100 && b == 100 && c1 == 0 && c2 == 0 {
            seconds = Some(lost.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seconds = seconds.expect("every lockout enforced again by both instances");
    assert!(seconds < 10.0, "re-enforced after {seconds:.1} s");
    // The rebuild's counter moves once its epoch is written, right after the lockouts; a
    // second rebuild would follow within the next epoch check.
    let rebuilt_since =
        || async { first.rebuilds().await + second.rebuilds().await - rebuilds_before };
    for _ in 0..50 {
        if rebuilt_since().await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rebuilds = rebuilt_since().await;
    assert_eq!(rebuilds, 1, "exactly one instance rebuilt");
    eprintln!(
        "redis restarted empty: 100 lockouts enforced again by 2 instances after {seconds:.1} s"
    );
    drop(redis);
}

/// A /24 blocked for spraying from rotating addresses, then the hot store loses everything:
/// an instance that never saw the block (its memory is not the one that made it) enforces it.
async fn a_blocked_network_stays_blocked_after_the_hot_store_is_lost(app: TestApp) {
    let spray: Vec<Value> = (0..50)
        .map(|i| {
            failure(
                &format!("net-spray-{i}"),
                &format!("net-user{i}"),
                &format!("198.51.100.{}", 1 + i % 5),
            )
        })
        .collect();
    app.post_auth(spray).await;
    // A login on an account that does not know the network gets a login challenge.
    let blocked = |response: Value| response["challenge"]["code"] == "network_blocked";
    let answer: Value = auth_check(&app, "198.51.100.99", "someone")
        .await
        .json()
        .await
        .unwrap();
    assert!(blocked(answer.clone()), "{answer}");
    let asked = match lose_hot_store(&app).await {
        Some(restarted) => restarted,
        None => {
            let fresh = app.another_instance().await;
            fresh.app.scoring.network_blocks().refresh().await.unwrap();
            fresh
        }
    };
    let answer: Value = auth_check(&asked, "198.51.100.98", "someone-else")
        .await
        .json()
        .await
        .unwrap();
    assert!(blocked(answer.clone()), "{answer}");
}
