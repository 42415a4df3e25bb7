//! The analyst's questions, on both backends: which accounts did this address attack, who is
//! failing but not yet locked, what happened to this account and why, release what an
//! incident hit in one call, clear a subject's penalties.
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, assert_envelope};
use crate::lockout::failure;
use crate::on_both_backends;

on_both_backends!(
    an_attack_from_one_network_is_found_and_released_in_bulk,
    failing_accounts_separate_locked_from_not_yet_locked,
    the_timeline_tells_why_an_account_was_locked_and_who_released_it,
    penalties_of_a_spraying_ip_are_cleared_and_audited,
    bad_filters_and_forged_cursors_get_400,
    analyst_routes_check_their_roles,
    block_rates_count_each_class_per_minute,
    the_history_tells_why_a_request_was_refused_and_who_was_challenged,
    a_lockout_is_extended_and_shortened_everywhere_at_once,
    a_data_subject_is_exported_then_erased_everywhere,
    lockouts_and_failures_are_searched_by_asn,
    auth_events_are_searched_and_paged,
);

/// `n` failures of `account` from `ip`, event ids `prefix-0…`, human-paced.
async fn fail_from(app: &TestApp, prefix: &str, account: &str, ip: &str, n: usize) {
    app.fail(prefix, account, &[ip], n).await;
}

async fn analyst(app: &TestApp) -> String {
    app.create_token("analyst", "ana").await.1
}

async fn get_as(app: &TestApp, token: &str, path: &str) -> Value {
    let response = app.get(path, Some(token)).await;
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    response.json().await.unwrap()
}

async fn post_as(app: &TestApp, token: &str, path: &str, body: &Value) -> Value {
    let response = app.post(path, Some(token), body).await;
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "POST {path}: {body}");
    body
}

fn accounts(items: &Value) -> Vec<String> {
    let mut names: Vec<String> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["account"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

/// Three accounts locked from 198.51.100.7 and one from elsewhere: searches by address and
/// by networks of several widths (aligned or not) find exactly the three; a dry run names
/// them and changes nothing; the release frees them (and not the fourth) and is audited.
async fn an_attack_from_one_network_is_found_and_released_in_bulk(app: TestApp) {
    for account in ["a1", "a2", "a3"] {
        fail_from(&app, &format!("x-{account}"), account, "198.51.100.7", 10).await;
    }
    fail_from(&app, "y-b1", "b1", "203.0.113.9", 10).await;
    let token = analyst(&app).await;

    for ip in [
        "198.51.100.7",
        "198.51.100.0/24",
        "198.51.96.0/20",
        "198.51.0.0/16",
        "::ffff:198.51.100.7",
    ] {
        let page = get_as(&app, &token, &format!("/v1/lockouts?ip={ip}")).await;
        assert_eq!(accounts(&page["items"]), ["a1", "a2", "a3"], "ip={ip}");
    }
    let page = get_as(&app, &token, "/v1/lockouts?ip=198.51.101.0/24").await;
    assert_eq!(accounts(&page["items"]), Vec::<String>::new());
    let page = get_as(
        &app,
        &token,
        "/v1/lockouts?ip=203.0.113.9&reason=account_failures",
    )
    .await;
    assert_eq!(accounts(&page["items"]), ["b1"]);
    let page = get_as(
        &app,
        &token,
        "/v1/lockouts?ip=203.0.113.9&reason=other_reason",
    )
    .await;
    assert_eq!(accounts(&page["items"]), Vec::<String>::new());
    // Paged: one at a time, every one exactly once.
    let mut seen = Vec::new();
    let mut path = "/v1/lockouts?ip=198.51.100.0/24&limit=1".to_owned();
    loop {
        let page = get_as(&app, &token, &path).await;
        seen.extend(accounts(&page["items"]));
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                path = format!("/v1/lockouts?ip=198.51.100.0/24&limit=1&cursor={cursor}")
            }
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["a1", "a2", "a3"]);

    let filter = json!({"ip": "198.51.100.0/24"});
    let dry = post_as(
        &app,
        &token,
        "/v1/lockouts/release",
        &json!({"filter": filter, "reason": "incident 42: shared test IP", "dry_run": true}),
    )
    .await;
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["count"].as_u64()),
        (Some(true), Some(3))
    );
    assert_eq!(accounts(&dry["items"]), ["a1", "a2", "a3"]);
    let active = get_as(&app, &token, "/v1/lockouts").await;
    assert_eq!(
        accounts(&active["items"]),
        ["a1", "a2", "a3", "b1"],
        "a dry run changes nothing"
    );

    let done = post_as(
        &app,
        &token,
        "/v1/lockouts/release",
        &json!({"filter": filter, "reason": "incident 42: shared test IP"}),
    )
    .await;
    assert_eq!(
        (done["dry_run"].as_bool(), done["count"].as_u64()),
        (Some(false), Some(3))
    );
    assert!(
        done["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["released_by"] == "ana"
                && l["release_reason"] == "incident 42: shared test IP")
    );
    let active = get_as(&app, &token, "/v1/lockouts").await;
    assert_eq!(accounts(&active["items"]), ["b1"]);
    for account in ["a1", "a2", "a3"] {
        assert_eq!(
            app.status(account, "198.51.100.7", None).await["action"],
            "none"
        );
    }
    // Again: nothing left to release.
    let again = post_as(
        &app,
        &token,
        "/v1/lockouts/release",
        &json!({"filter": filter, "reason": "again"}),
    )
    .await;
    assert_eq!(again["count"], 0);

    let audit = get_as(&app, &token, "/v1/audit?action=lockout.bulk_release").await;
    let entries = audit["items"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{audit}");
    let first = entries.last().unwrap();
    assert_eq!(first["actor"]["name"], "ana");
    assert_eq!(first["details"]["filter"]["ip"], "198.51.100.0/24");
    assert_eq!(first["details"]["released"].as_array().unwrap().len(), 3);
    let single = get_as(&app, &token, "/v1/audit?action=lockout.release").await;
    assert_eq!(single["items"].as_array().unwrap().len(), 3);
}

/// Who is failing: by address, locked or not yet locked, the most failures first.
async fn failing_accounts_separate_locked_from_not_yet_locked(app: TestApp) {
    fail_from(&app, "f-locked", "locked-one", "192.0.2.44", 10).await;
    fail_from(&app, "f-close", "close-one", "192.0.2.44", 4).await;
    fail_from(&app, "f-far", "far-one", "192.0.2.45", 2).await;
    let token = analyst(&app).await;

    let all = get_as(&app, &token, "/v1/accounts/failing").await;
    let names: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["account"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["locked-one", "close-one", "far-one"],
        "most failures first"
    );
    assert_eq!(all["items"][0]["failures"], 10);
    assert!(all["items"][0]["lockout_id"].is_string());
    assert!(all["items"][1]["lockout_id"].is_null());

    let not_yet = get_as(&app, &token, "/v1/accounts/failing?locked=false").await;
    assert_eq!(accounts(&not_yet["items"]), ["close-one", "far-one"]);
    let from_ip = get_as(
        &app,
        &token,
        "/v1/accounts/failing?ip=192.0.2.44&locked=false",
    )
    .await;
    assert_eq!(accounts(&from_ip["items"]), ["close-one"]);
    assert_eq!(from_ip["items"][0]["ips"], 1);
    let locked = get_as(&app, &token, "/v1/accounts/failing?locked=true").await;
    assert_eq!(accounts(&locked["items"]), ["locked-one"]);
    let later = get_as(
        &app,
        &token,
        "/v1/accounts/failing?since=2999-01-01T00:00:00Z",
    )
    .await;
    assert_eq!(later["items"], json!([]));
}

/// "Why was this user blocked, and who let them back in?"
async fn the_timeline_tells_why_an_account_was_locked_and_who_released_it(app: TestApp) {
    app.post_auth(vec![json!({"event_id": "t-ok", "type": "login_success",
        "account": "Dana@Example.com", "ip": "192.0.2.10", "device_id": "danas-phone",
        "ts": app.human_paced_ts()})])
        .await;
    fail_from(&app, "t-bad", "dana@example.com", "203.0.113.50", 10).await;
    let token = analyst(&app).await;
    let lockout = &get_as(&app, &token, "/v1/lockouts?account=dana@example.com").await["items"][0];
    let id = lockout["id"].as_str().unwrap().to_owned();
    app.advance(std::time::Duration::from_millis(1500)).await;
    post_as(
        &app,
        &token,
        &format!("/v1/lockouts/{id}/release"),
        &json!({"reason": "verified by phone"}),
    )
    .await;

    // Searched by any spelling of the account.
    let timeline = get_as(&app, &token, "/v1/accounts/DANA@example.com/timeline").await;
    assert_eq!(timeline["account"], "dana@example.com");
    let items = timeline["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds[0], "release", "{kinds:?}");
    assert!(
        items[0]["summary"]
            .as_str()
            .unwrap()
            .contains("verified by phone")
    );
    assert_eq!(items[0]["reference"], id.as_str());
    let lock = items.iter().find(|i| i["kind"] == "lockout").unwrap();
    assert_eq!(lock["details"]["reason"], "account_failures");
    assert_eq!(lock["details"]["failures"], 10);
    assert_eq!(kinds.iter().filter(|k| **k == "login_failure").count(), 10);
    let success = items.iter().find(|i| i["kind"] == "login_success").unwrap();
    assert_eq!(success["details"]["device_id"], "danas-phone");
    assert_eq!(success["details"]["account_received"], "Dana@Example.com");
    // Newest first.
    let times: Vec<&str> = items.iter().map(|i| i["at"].as_str().unwrap()).collect();
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(times, sorted);

    // Pages of 4 cover the same items, none twice.
    let mut paged = Vec::new();
    let mut path = "/v1/accounts/dana@example.com/timeline?limit=4".to_owned();
    loop {
        let page = get_as(&app, &token, &path).await;
        for item in page["items"].as_array().unwrap() {
            paged.push((item["kind"].clone(), item["reference"].clone()));
        }
        match page["next_until"].as_str() {
            Some(until) => {
                path = format!(
                    "/v1/accounts/dana@example.com/timeline?limit=4&until={}",
                    until.replace('+', "%2B")
                );
            }
            None => break,
        }
    }
    let whole: Vec<(Value, Value)> = items
        .iter()
        .map(|i| (i["kind"].clone(), i["reference"].clone()))
        .collect();
    assert_eq!(paged.len(), whole.len());
    for item in &whole {
        assert!(paged.contains(item), "{item:?} missing from the pages");
    }
}

/// A spraying IP is blocked on auth; the analyst clears it (a shared test address): the
/// block lifts at once, the audit log and the IP's next spraying start from zero.
async fn penalties_of_a_spraying_ip_are_cleared_and_audited(app: TestApp) {
    let events: Vec<Value> = (0..20)
        .map(|i| failure(&format!("pc-{i}"), &format!("user{i}"), "203.0.113.77"))
        .collect();
    app.post_auth(events).await;
    let check = json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.77", "user_id": "fresh"});
    assert_eq!(
        app.limit_check(&check).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let token = analyst(&app).await;
    let before = get_as(
        &app,
        &token,
        "/v1/multipliers?endpoint=/auth/login&method=POST&ip=203.0.113.77",
    )
    .await;
    assert_eq!(before["multiplier"], 0.0, "{before}");

    let cleared = post_as(
        &app,
        &token,
        "/v1/penalties/clear",
        &json!({"ip": "203.0.113.77", "reason": "our own load test"}),
    )
    .await;
    assert_eq!(cleared["subject"], "ip:203.0.113.77");
    assert!(
        cleared["cleared"]
            .as_array()
            .unwrap()
            .contains(&json!("velocity:spraying")),
        "{cleared}"
    );
    let after = get_as(
        &app,
        &token,
        "/v1/multipliers?endpoint=/auth/login&method=POST&ip=203.0.113.77",
    )
    .await;
    assert_eq!(after["multiplier"], 1.0, "{after}");
    // The IP's window is empty: one more failure does not bring the block back.
    app.post_auth(vec![failure("pc-more", "user-more", "203.0.113.77")])
        .await;
    let again = get_as(
        &app,
        &token,
        "/v1/multipliers?endpoint=/auth/login&method=POST&ip=203.0.113.77",
    )
    .await;
    assert_eq!(again["multiplier"], 1.0, "{again}");

    let audit = get_as(&app, &token, "/v1/audit?action=penalty.clear").await;
    assert_eq!(audit["items"][0]["target"], "ip:203.0.113.77");
    assert_eq!(audit["items"][0]["details"]["reason"], "our own load test");
}

async fn bad_filters_and_forged_cursors_get_400(app: TestApp) {
    let token = analyst(&app).await;
    for path in [
        "/v1/lockouts?ip=nonsense",
        "/v1/lockouts?ip=198.51.100.0/33",
        "/v1/lockouts?reason=DROP%20TABLE",
        "/v1/lockouts?until=yesterday",
        "/v1/lockouts?cursor=not-a-cursor",
        "/v1/lockouts?device_id=",
        "/v1/lockouts?colour=red",
        "/v1/accounts/failing?ip=300.1.1.1",
        "/v1/accounts/failing?limit=0",
        "/v1/accounts/failing?locked=maybe",
        "/v1/accounts/alice/timeline?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
        "/v1/accounts/alice/timeline?limit=5000",
    ] {
        let response = app.get(path, Some(&token)).await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    for body in [
        json!({"filter": {}, "reason": "everything"}),
        json!({"filter": {"status": "active"}, "reason": "everything"}),
        json!({"filter": {"account": "a", "status": "released"}, "reason": "x"}),
        json!({"filter": {"account": "a"}, "reason": "  "}),
        json!({"filter": {"account": "a", "colour": "red"}, "reason": "x"}),
        json!({"filter": {"ip": "10.0.0.0/99"}, "reason": "x"}),
    ] {
        let response = app.post("/v1/lockouts/release", Some(&token), &body).await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    for body in [
        json!({"reason": "nobody"}),
        json!({"account": "a", "ip": "192.0.2.1", "reason": "two"}),
        json!({"ip": "not-an-ip", "reason": "x"}),
        json!({"account": "a", "reason": ""}),
    ] {
        let response = app.post("/v1/penalties/clear", Some(&token), &body).await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
}

/// Analysts search, release and clear; gateways read multipliers and reputation, which
/// analysts may read too; neither ingests nor administers.
async fn analyst_routes_check_their_roles(app: TestApp) {
    let analyst = analyst(&app).await;
    let limiter = app.create_token("limiter", "gw").await.1;
    let ingest = app.create_token("ingest", "auth").await.1;
    for path in [
        "/v1/lockouts?ip=192.0.2.0/24",
        "/v1/accounts/failing",
        "/v1/accounts/alice/timeline",
        "/v1/audit",
    ] {
        assert_eq!(
            app.get(path, Some(&analyst)).await.status(),
            StatusCode::OK,
            "{path}"
        );
        for other in [&limiter, &ingest] {
            assert_envelope(
                app.get(path, Some(other)).await,
                StatusCode::FORBIDDEN,
                "FORBIDDEN",
            )
            .await;
        }
        assert_envelope(
            app.get(path, None).await,
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
        )
        .await;
    }
    for path in [
        "/v1/multipliers?endpoint=/auth/login&method=POST&ip=192.0.2.1",
        "/v1/reputation/192.0.2.1",
    ] {
        for token in [&analyst, &limiter] {
            assert_eq!(
                app.get(path, Some(token)).await.status(),
                StatusCode::OK,
                "{path}"
            );
        }
        let response = app.get(path, Some(&ingest)).await;
        let body = assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("limiter or analyst"),
            "{body}"
        );
    }
    for (path, body) in [
        (
            "/v1/lockouts/release",
            json!({"filter": {"account": "a"}, "reason": "x"}),
        ),
        (
            "/v1/penalties/clear",
            json!({"account": "a", "reason": "x"}),
        ),
    ] {
        for other in [&limiter, &ingest] {
            let response = app.post(path, Some(other), &body).await;
            assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
        }
        assert_eq!(
            app.post(path, Some(&analyst), &body).await.status(),
            StatusCode::OK
        );
    }
    // Analysts do not administer.
    let response = app
        .post(
            "/v1/admin/tokens",
            Some(&analyst),
            &json!({"role": "admin", "name": "x", "reason": "x"}),
        )
        .await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
}

/// The overview's chart: allowed and refused decisions per class and minute.
async fn block_rates_count_each_class_per_minute(app: TestApp) {
    let events: Vec<Value> = (0..20)
        .map(|i| failure(&format!("br-{i}"), &format!("user{i}"), "203.0.113.88"))
        .collect();
    app.post_auth(events).await;
    let blocked = json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.88"});
    let fine = json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.88"});
    for _ in 0..2 {
        assert_eq!(
            app.limit_check(&blocked).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(app.limit_check(&fine).await.status(), StatusCode::OK);
    let token = analyst(&app).await;
    let hour = get_as(&app, &token, "/v1/stats/decisions").await;
    assert_eq!(
        (hour["window"].as_str(), hour["step_s"].as_u64()),
        (Some("hour"), Some(60))
    );
    let auth = hour["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["class"] == "auth")
        .unwrap();
    assert_eq!(
        (auth["allowed"].as_u64(), auth["limited"].as_u64()),
        (Some(1), Some(2)),
        "{auth}"
    );
    assert!((auth["block_rate"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9);
    let points = auth["points"].as_array().unwrap();
    assert_eq!(points.len(), 60);
    assert_eq!(points[59]["limited"], 2, "the last point is this minute");
    let day = get_as(&app, &token, "/v1/stats/decisions?window=day").await;
    assert_eq!(day["classes"][0]["points"].as_array().unwrap().len(), 96);
    let response = app
        .get("/v1/stats/decisions?window=week", Some(&token))
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

/// "Why was this user refused at 14:02?": refusals of one key by one budget count into one
/// entry with its explanation; a known context's challenge is kept too; both show in the
/// account's timeline; entries go after the retention.
async fn the_history_tells_why_a_request_was_refused_and_who_was_challenged(app: TestApp) {
    app.post_auth(vec![json!({"event_id": "h-ok", "type": "login_success",
        "account": "erin", "ip": "198.51.100.10", "device_id": "erins-phone",
        "ts": app.human_paced_ts()})])
        .await;
    fail_from(&app, "h-bad", "erin", "203.0.113.40", 10).await;
    let login = |ip: &str, device: Option<&str>| {
        let mut body = json!({"endpoint": "/auth/login", "method": "POST", "ip": ip,
            "user_id": "erin", "consume": false});
        if let Some(device) = device {
            body["device_id"] = json!(device);
        }
        body
    };
    for _ in 0..3 {
        let refused = app.limit_check(&login("203.0.113.41", None)).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    let owner = app
        .limit_check(&login("192.0.2.77", Some("erins-phone")))
        .await;
    assert_eq!(owner.status(), StatusCode::OK);
    assert_eq!(owner.headers()["x-palisade-challenge"], "known_context");
    // Fine requests are not history.
    let fine = json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.78"});
    assert_eq!(app.limit_check(&fine).await.status(), StatusCode::OK);
    app.app.history.flush().await.unwrap();

    let token = analyst(&app).await;
    let page = get_as(&app, &token, "/v1/history?account=ERIN").await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{page}");
    let refused = items.iter().find(|i| i["outcome"] == "limited").unwrap();
    assert_eq!(refused["count"], 3, "three refusals, one entry");
    assert_eq!(
        (refused["class"].as_str(), refused["reason"].as_str()),
        (Some("auth"), Some("account_locked"))
    );
    assert_eq!(refused["ip"], "203.0.113.41");
    let explanation = &refused["explanation"];
    let deciding = &explanation["scopes"][explanation["deciding"].as_u64().unwrap() as usize];
    assert_eq!(deciding["key"], "user:erin", "{explanation}");
    assert_eq!(deciding["multiplier"], 0.0);
    let why: Vec<&str> = explanation["keys"]["user:erin"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert!(why.contains(&"lockout"), "{why:?}");
    let challenged = items.iter().find(|i| i["outcome"] == "challenge").unwrap();
    assert_eq!(challenged["reason"], "known_context");
    assert_eq!(challenged["device_key"], "device:erins-phone");
    assert!(challenged["explanation"]["lockout_id"].is_string());

    let by_ip = get_as(&app, &token, "/v1/history?ip=203.0.113.41").await;
    assert_eq!(by_ip["items"].as_array().unwrap().len(), 1);
    let by_device = get_as(&app, &token, "/v1/history?device_id=erins-phone").await;
    assert_eq!(by_device["items"].as_array().unwrap().len(), 1);
    let none = get_as(&app, &token, "/v1/history?ip=192.0.2.78").await;
    assert_eq!(none["items"], json!([]), "allowed requests are not kept");
    let paged = get_as(&app, &token, "/v1/history?account=erin&limit=1").await;
    let cursor = paged["next_cursor"].as_str().unwrap();
    let rest = get_as(
        &app,
        &token,
        &format!("/v1/history?account=erin&limit=1&cursor={cursor}"),
    )
    .await;
    assert_ne!(paged["items"][0]["id"], rest["items"][0]["id"]);
    assert!(rest["next_cursor"].is_null());

    let timeline = get_as(&app, &token, "/v1/accounts/erin/timeline").await;
    let kinds: Vec<&str> = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"decision.limited") && kinds.contains(&"decision.challenge"),
        "{kinds:?}"
    );

    for path in [
        "/v1/history?ip=203.0.113.0/24",
        "/v1/history?cursor=forged",
        "/v1/history?limit=501",
    ] {
        assert_envelope(
            app.get(path, Some(&token)).await,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        )
        .await;
    }
    // After the retention (7 days by default) the entries go.
    if app.clock.is_some() {
        app.advance(std::time::Duration::from_secs(8 * 86_400))
            .await;
        assert_eq!(app.app.history.prune().await.unwrap(), 2);
        let gone = get_as(&app, &token, "/v1/history?account=erin").await;
        assert_eq!(gone["items"], json!([]));
    }
}

fn rfc3339_in(app: &TestApp, ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(app.app.clock.now_ms() + ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// An analyst extends a lockout (the incident needs longer) and shortens another: the row,
/// the enforcement marker and the account's status move together; audited.
async fn a_lockout_is_extended_and_shortened_everywhere_at_once(app: TestApp) {
    fail_from(&app, "rt-f", "frank", "203.0.113.30", 10).await;
    let token = analyst(&app).await;
    let lockout = get_as(&app, &token, "/v1/lockouts?account=frank").await["items"][0].clone();
    let id = lockout["id"].as_str().unwrap();
    let path = format!("/v1/lockouts/{id}");
    let patch = |until: String, reason: &str| {
        let body = json!({"locked_until": until, "reason": reason});
        let path = path.clone();
        let token = token.clone();
        let app = &app;
        async move {
            app.request(reqwest::Method::PATCH, &path, Some(&token), Some(&body))
                .await
        }
    };
    let later = rfc3339_in(&app, 2 * 3_600_000);
    let response = patch(later.clone(), "incident still open").await;
    assert_eq!(response.status(), StatusCode::OK);
    let moved: Value = response.json().await.unwrap();
    assert_eq!(moved["locked_until"], later.as_str());
    let status = app.status("frank", "203.0.113.30", None).await;
    assert_eq!(status["action"], "lockout");
    let marker_end = chrono::DateTime::parse_from_rfc3339(status["locked_until"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    let wanted = chrono::DateTime::parse_from_rfc3339(&later)
        .unwrap()
        .timestamp_millis();
    assert!(
        (marker_end - wanted).abs() < 2_000,
        "the marker moved: {status}"
    );

    let sooner = rfc3339_in(&app, 60_000);
    assert_eq!(
        patch(sooner, "owner verified").await.status(),
        StatusCode::OK
    );
    let status = app.status("frank", "203.0.113.30", None).await;
    let marker_end = chrono::DateTime::parse_from_rfc3339(status["locked_until"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert!(marker_end - app.app.clock.now_ms() <= 61_000, "{status}");
    let audit = get_as(&app, &token, "/v1/audit?action=lockout.retime").await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 2);
    assert_eq!(audit["items"][0]["details"]["reason"], "owner verified");

    // In the past, too far, malformed: 400. Released: 409.
    for until in [
        rfc3339_in(&app, -1_000),
        rfc3339_in(&app, 400 * 86_400_000),
        "soon".to_owned(),
    ] {
        assert_envelope(
            patch(until, "x").await,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        )
        .await;
    }
    post_as(
        &app,
        &token,
        &format!("/v1/lockouts/{id}/release"),
        &json!({"reason": "done"}),
    )
    .await;
    assert_envelope(
        patch(later, "again").await,
        StatusCode::CONFLICT,
        "CONFLICT",
    )
    .await;
    let unknown = app
        .request(
            reqwest::Method::PATCH,
            "/v1/lockouts/01ARZ3NDEKTSV4RRFFQ69G5FAV",
            Some(&token),
            Some(&json!({"locked_until": rfc3339_in(&app, 60_000), "reason": "x"})),
        )
        .await;
    assert_envelope(unknown, StatusCode::NOT_FOUND, "NOT_FOUND").await;
}

/// A data-subject request: the export holds everything stored about the account; the
/// erasure removes it from the tables and the hot store at once, leaves other accounts as
/// they are, and the audit log keeps only a pseudonym.
async fn a_data_subject_is_exported_then_erased_everywhere(app: TestApp) {
    app.post_auth(vec![json!({"event_id": "ds-ok", "type": "login_success",
        "account": "Grace", "ip": "198.51.100.20", "device_id": "graces-phone",
        "ts": app.human_paced_ts()})])
        .await;
    fail_from(&app, "ds-bad", "grace", "203.0.113.20", 10).await;
    fail_from(&app, "ds-other", "heidi", "203.0.113.21", 2).await;
    let refused = json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.22",
        "user_id": "grace", "consume": false});
    assert_eq!(
        app.limit_check(&refused).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    app.app.history.flush().await.unwrap();
    let token = analyst(&app).await;
    let id = get_as(&app, &token, "/v1/lockouts?account=grace").await["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let later = rfc3339_in(&app, 3_600_000);
    let response = app
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/lockouts/{id}"),
            Some(&token),
            Some(&json!({"locked_until": later, "reason": "grace asked us to wait"})),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);

    let export = get_as(&app, &token, "/v1/accounts/GRACE/export").await;
    assert_eq!(export["account"], "grace");
    assert_eq!(export["auth_events"].as_array().unwrap().len(), 11);
    assert_eq!(export["auth_events"][0]["account_received"], "Grace");
    assert_eq!(
        export["lockouts"][0]["event_ids"].as_array().unwrap().len(),
        10
    );
    assert_eq!(export["decision_history"][0]["reason"], "account_locked");
    assert!(!export["alerts"].as_array().unwrap().is_empty());
    assert!(
        export["factors"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["id"] == "velocity:lockout")
    );
    assert!(
        export["audit"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["action"] == "lockout.retime")
    );

    // Erasure is an admin's.
    let erase = json!({"reason": "GDPR art. 17 request 2026-118"});
    let response = app
        .post("/v1/accounts/grace/erase", Some(&token), &erase)
        .await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    let response = app
        .post(
            "/v1/accounts/grace/erase",
            Some(ADMIN_TOKEN),
            &json!({"reason": ""}),
        )
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let erased = post_as(&app, ADMIN_TOKEN, "/v1/accounts/grace/erase", &erase).await;
    let pseudonym = erased["pseudonym"].as_str().unwrap().to_owned();
    assert!(pseudonym.starts_with("anon-"));
    let counts = &erased["erased"];
    assert_eq!(
        (counts["auth_events"].as_u64(), counts["lockouts"].as_u64()),
        (Some(11), Some(1)),
        "{erased}"
    );
    assert!(counts["decision_history"].as_u64().unwrap() >= 1);
    assert!(counts["alerts"].as_u64().unwrap() >= 1);
    assert!(
        counts["audit_pseudonymised"].as_u64().unwrap() >= 2,
        "{erased}"
    );

    // The audit log names the pseudonym, never the account (the export's entry included).
    let audit = app
        .get("/v1/audit?limit=500", Some(&token))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        !audit.contains("\"grace\"") && !audit.contains("user:grace"),
        "{audit}"
    );
    assert!(audit.contains(&pseudonym));
    // Gone everywhere: tables, enforcement, windows (looking again is a new, audited access).
    let after = get_as(&app, &token, "/v1/accounts/grace/export").await;
    for part in [
        "auth_events",
        "lockouts",
        "decision_history",
        "alerts",
        "factors",
    ] {
        assert_eq!(after[part], json!([]), "{part}: {after}");
    }
    let status = app.status("grace", "203.0.113.22", None).await;
    assert_eq!(
        (
            status["action"].as_str(),
            status["failures_in_window"].as_u64()
        ),
        (Some("none"), Some(0)),
        "{status}"
    );
    let check = app.limit_check(&refused).await;
    assert_eq!(
        check.status(),
        StatusCode::OK,
        "the lockout is lifted with the data"
    );
    let timeline = get_as(&app, &token, "/v1/accounts/grace/timeline").await;
    let kinds: Vec<&str> = timeline["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["account.export"], "only the access just made");
    let erasure = get_as(&app, &token, "/v1/audit?action=account.erase").await;
    assert_eq!(erasure["items"][0]["target"], format!("user:{pseudonym}"));
    // Another account is untouched.
    let failing = get_as(&app, &token, "/v1/accounts/failing").await;
    assert_eq!(accounts(&failing["items"]), ["heidi"]);
}

/// "Which accounts did AS1221 go for?": addresses of one ASN (from the ASN database) find
/// their lockouts and failures; another ASN's do not.
async fn lockouts_and_failures_are_searched_by_asn(app: TestApp) {
    app.load_data(&[(
        "tests/fixtures/mmdb/GeoLite2-ASN-Test.mmdb",
        "asn/GeoLite2-ASN-Test.mmdb",
    )])
    .await;
    // Two Telstra (AS1221) addresses in different /16s, one address outside it.
    fail_from(&app, "asn-a", "kate", "1.128.0.1", 10).await;
    fail_from(&app, "asn-b", "liam", "1.130.9.9", 10).await;
    fail_from(&app, "asn-c", "mona", "203.0.113.70", 10).await;
    fail_from(&app, "asn-d", "ned", "1.129.4.4", 3).await;
    let token = analyst(&app).await;
    for asn in ["AS1221", "1221", "as1221"] {
        let page = get_as(&app, &token, &format!("/v1/lockouts?asn={asn}")).await;
        assert_eq!(accounts(&page["items"]), ["kate", "liam"], "asn={asn}");
    }
    let both = get_as(&app, &token, "/v1/lockouts?asn=AS1221&ip=1.128.0.0/16").await;
    assert_eq!(accounts(&both["items"]), ["kate"]);
    let failing = get_as(&app, &token, "/v1/accounts/failing?asn=AS1221&locked=false").await;
    assert_eq!(accounts(&failing["items"]), ["ned"]);
    let none = get_as(&app, &token, "/v1/lockouts?asn=AS7018").await;
    assert_eq!(none["items"], json!([]));
    let dry = post_as(
        &app,
        &token,
        "/v1/lockouts/release",
        &json!({"filter": {"asn": "AS1221"}, "reason": "carrier incident", "dry_run": true}),
    )
    .await;
    assert_eq!(dry["count"], 2);
    for path in ["/v1/lockouts?asn=ASN1", "/v1/lockouts?asn=99999999999"] {
        assert_envelope(
            app.get(path, Some(&token)).await,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        )
        .await;
    }
}

/// Auth events by account, address, device, type and time, newest first, in pages that
/// neither skip nor repeat (a forged cursor is a 400).
async fn auth_events_are_searched_and_paged(app: TestApp) {
    fail_from(&app, "ev-a", "olga", "192.0.2.50", 5).await;
    fail_from(&app, "ev-b", "pete", "192.0.2.51", 3).await;
    app.post_auth(vec![
        json!({"event_id": "ev-ok", "type": "login_success", "account": "olga",
        "ip": "192.0.2.50", "device_id": "olgas-phone", "ts": app.human_paced_ts()}),
    ])
    .await;
    let token = analyst(&app).await;
    let all = get_as(&app, &token, "/v1/events/auth?account=OLGA").await;
    let items = all["items"].as_array().unwrap();
    assert_eq!(items.len(), 6);
    assert_eq!(items[0]["event_id"], "ev-ok", "newest first");
    let failures = get_as(
        &app,
        &token,
        "/v1/events/auth?account=olga&type=login_failure",
    )
    .await;
    assert_eq!(failures["items"].as_array().unwrap().len(), 5);
    let by_net = get_as(
        &app,
        &token,
        "/v1/events/auth?ip=192.0.2.0/24&type=login_failure",
    )
    .await;
    assert_eq!(by_net["items"].as_array().unwrap().len(), 8);
    let by_device = get_as(&app, &token, "/v1/events/auth?device_id=olgas-phone").await;
    assert_eq!(by_device["items"][0]["event_id"], "ev-ok");
    let future = get_as(&app, &token, "/v1/events/auth?since=2999-01-01T00:00:00Z").await;
    assert_eq!(future["items"], json!([]));

    let mut seen = Vec::new();
    let mut path = "/v1/events/auth?ip=192.0.2.0/24&limit=3".to_owned();
    loop {
        let page = get_as(&app, &token, &path).await;
        for item in page["items"].as_array().unwrap() {
            seen.push(item["event_id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                path = format!("/v1/events/auth?ip=192.0.2.0/24&limit=3&cursor={cursor}")
            }
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((seen.len(), unique.len()), (9, 9), "{seen:?}");

    for path in [
        "/v1/events/auth?cursor=forged",
        "/v1/events/auth?cursor=12.%%%",
        "/v1/events/auth?type=login_maybe",
        "/v1/events/auth?ip=192.0.2.0/99",
    ] {
        assert_envelope(
            app.get(path, Some(&token)).await,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        )
        .await;
    }
    // Ingest tokens post events; they do not read them back.
    let ingest = app.create_token("ingest", "auth-service").await.1;
    let response = app.get("/v1/events/auth", Some(&ingest)).await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
}
