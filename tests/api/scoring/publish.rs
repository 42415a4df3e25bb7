//! Publishing multipliers: the decision stream, expiring and concurrent factors, cached answers, batched publishes and the factor hash's lifetime.

use super::*;

on_both_backends!(
    the_decision_stream_follows_changes_and_snapshots,
    a_shorter_factor_expiring_republishes_the_longer_one,
    concurrent_changes_from_two_instances_publish_the_latest_factors,
    a_cached_multiplier_answer_never_outlives_a_change,
    factors_asserted_together_publish_as_one_by_one,
    a_snapshot_comes_in_pages_of_limit,
);

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

/// A snapshot larger than `limit` comes in pages: each entry once, every page with the
/// cursor taken before the first; a forged page token is a 400.
async fn a_snapshot_comes_in_pages_of_limit(app: TestApp) {
    for i in 0..25 {
        let user = palisade::model::SubjectKey::user(&format!("paged-{i:02}"), 64).unwrap();
        app.app
            .scoring
            .assert(
                &user,
                palisade::scoring::Factor::scale("test", "paged", 0.5, "paged"),
            )
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut cursors = std::collections::BTreeSet::new();
    let mut path = "/v1/decisions?limit=10".to_owned();
    let mut pages = 0;
    loop {
        let page: Value = app.admin_json(&path).await;
        pages += 1;
        assert_eq!(page["snapshot"], true, "{page}");
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 10, "{page}");
        seen.extend(
            items
                .iter()
                .map(|i| i["subject"].as_str().unwrap().to_owned()),
        );
        cursors.insert(page["next_cursor"].as_str().unwrap().to_owned());
        match page["snapshot_next"].as_str() {
            Some(next) => path = format!("/v1/decisions?limit=10&snapshot_after={next}"),
            None => break,
        }
    }
    assert_eq!(pages, 3, "25 entries, 10 a page");
    assert_eq!(cursors.len(), 1, "one cursor for the whole snapshot");
    let unique: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no entry twice: {seen:?}");
    assert_eq!(seen.len(), 25);
    for forged in ["0-0.%%%", "abc.AAAA", "1-1"] {
        let bad = app
            .get(
                &format!("/v1/decisions?snapshot_after={forged}"),
                Some(ADMIN_TOKEN),
            )
            .await;
        assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
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
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
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
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
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
