//! The trust rules at the enforcement edge, tried as an attacker would: spellings of a
//! request target and of an account, on both backends.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, assert_envelope};
use crate::on_both_backends;

mod grants; // writes that grant trust leave a record; the bootstrap token retires

on_both_backends!(
    request_spellings_share_one_auth_budget,
    forward_auth_canonicalises_the_original_uri,
    account_spellings_are_one_account_everywhere,
    accent_variants_are_one_account_when_the_backend_ignores_accents,
    invisible_and_control_characters_in_ids_are_refused,
    a_stranger_cannot_lock_the_owner_out_at_the_limiter,
    the_quick_login_signal_cannot_be_dodged,
    a_reused_event_id_with_other_content_is_a_conflict_and_counts_nothing,
);

fn check(endpoint: &str, user: &str, ip: &str) -> Value {
    json!({"endpoint": endpoint, "method": "POST", "ip": ip, "user_id": user})
}

/// Path rotation: the attacker spells `/login` every way a backend still serves as `/login`,
/// hoping each spelling lands in a laxer class with fresh buckets. Every spelling is the
/// auth class and draws on the one per-account auth budget (5 a minute).
async fn request_spellings_share_one_auth_budget(app: TestApp) {
    let spellings = [
        "/Login",
        "/login/",
        "//login",
        "/%6cogin",
        "/login;jsessionid=1",
        "/./login",
        "/static/../login",
        "/LOGIN?next=/",
        "/static/..;/login",
        "/auth%2f..%2f..%2flogin",
        "/%256cogin",
        "/x\\..\\login",
        // Format suffixes, dots and spaces Rails and Spring route as /login.
        "/login.json",
        "/Login.JSON",
        "/login.",
        "/login%20",
        "/login.xml/",
        // Bytes outside ASCII, in the query and in the path's tail.
        "/login?q=\u{e9}",
        "/login\u{a0}",
    ];
    let mut allowed = 0;
    for spelling in spellings {
        let response = app
            .limit_check(&check(spelling, "victim", "203.0.113.9"))
            .await;
        match response.status() {
            StatusCode::OK => {
                let body: Value = response.json().await.unwrap();
                assert_eq!(body["class"], "auth", "{spelling}");
                assert_eq!(body["budget"], "auth-account", "{spelling}");
                allowed += 1;
            }
            StatusCode::TOO_MANY_REQUESTS => {
                let body =
                    assert_envelope(response, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
                assert_eq!(
                    body["error"]["details"]["scope"], "endpoint_user",
                    "{spelling}"
                );
            }
            other => panic!("{spelling}: {other}"),
        }
    }
    assert_eq!(
        allowed, 5,
        "the account's auth budget, whatever the spelling"
    );
    // Spellings of other auth paths are auth too.
    for spelling in [
        "/oauth/token/",
        "/auth//login",
        "/Password/Reset",
        "/OTP/verify/",
    ] {
        let body: Value = app
            .limit_check(&check(spelling, "someone-else", "198.51.100.3"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(body["class"], "auth", "{spelling}");
    }
    // Not a path a server would serve: refused, never classified leniently.
    for bad in ["/login%00", "/log\u{1}in", "login", ""] {
        let response = app
            .limit_check(&check(bad, "someone-else", "198.51.100.3"))
            .await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
}

/// The same rotation through a gateway: forward-auth reads the original URI the proxy saw,
/// as the bytes the proxy sent (nginx passes raw UTF-8 from `$request_uri`). A target or
/// method it cannot read, or none at all, is a 400: never the laxer class of `/`.
async fn forward_auth_canonicalises_the_original_uri(app: TestApp) {
    let forward = |uri: Option<&[u8]>, method: Option<&[u8]>, user: &[u8]| {
        let mut request = app
            .client
            .get(app.url("/v1/forward-auth"))
            .bearer_auth(ADMIN_TOKEN)
            .header("x-forwarded-for", "198.51.100.77")
            .header(
                "x-user-id",
                reqwest::header::HeaderValue::from_bytes(user).unwrap(),
            );
        if let Some(uri) = uri {
            request = request.header(
                "x-forwarded-uri",
                reqwest::header::HeaderValue::from_bytes(uri).unwrap(),
            );
        }
        if let Some(method) = method {
            request = request.header(
                "x-forwarded-method",
                reqwest::header::HeaderValue::from_bytes(method).unwrap(),
            );
        }
        request.send()
    };
    let spellings: [&[u8]; 12] = [
        b"/Login",
        b"//login/",
        b"/%6Cogin;x=1",
        b"/a/../login",
        b"/LOGIN",
        b"/login",
        b"/login?q=\xc3\xa9",
        b"/login?q=\xff",
        b"/login.json",
        b"/login%20",
        b"/login.",
        b"http://app.example/login.json?x=\xc3\xa9",
    ];
    let mut allowed = 0;
    for spelling in spellings {
        let response = forward(Some(spelling), Some(b"POST"), b"gatekept")
            .await
            .unwrap();
        let shown = String::from_utf8_lossy(spelling);
        if response.status() == StatusCode::OK {
            allowed += 1;
            assert_eq!(response.headers()["x-ratelimit-limit"], "5", "{shown}");
        } else {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{shown}");
        }
    }
    assert_eq!(allowed, 5, "one auth budget for every spelling");
    // What cannot be read is refused, never read as `/`.
    for (uri, method, user) in [
        (None, Some(&b"POST"[..]), &b"gatekept"[..]),
        (Some(&b"/login"[..]), None, &b"gatekept"[..]),
        (Some(&b"login"[..]), Some(&b"POST"[..]), &b"gatekept"[..]),
        (Some(&b"/log\tin"[..]), Some(&b"POST"[..]), &b"gatekept"[..]),
        (
            Some(&b"/login"[..]),
            Some(&b"P\xc3\x96ST"[..]),
            &b"gatekept"[..],
        ),
        (
            Some(&b"/login"[..]),
            Some(&b"POST"[..]),
            &b"gate\xffkept"[..],
        ),
    ] {
        let response = forward(uri, method, user).await.unwrap();
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    // A user id in UTF-8 (from a JWT) is that user, not an anonymous caller.
    let response = forward(Some(b"/login"), Some(b"POST"), "v\u{ed}ctor".as_bytes())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["x-ratelimit-limit"],
        "5",
        "the account's budget"
    );
}

async fn post_events(app: &TestApp, events: Value) -> reqwest::Response {
    app.post(
        "/v1/events/auth",
        Some(ADMIN_TOKEN),
        &json!({ "events": events }),
    )
    .await
}

/// Account rotation: the attacker spells the victim's address with other cases, fullwidth
/// letters and surrounding spaces to reset its failure counter. They are one account: it
/// locks at its tenth failure, whatever the spellings, and an analyst searching any spelling
/// finds it, with the spelling each event arrived in.
/// An auth service on an accent-insensitive collation (MySQL's `utf8mb4_0900_ai_ci`) signs
/// `víctim@` in as `victim@`: with `http.account_ids = accent_insensitive` every accent
/// variant, and IDNA's ideographic full stop, draws on one account's lockout. The default
/// profile reads the full stop as a dot too.
async fn accent_variants_are_one_account_when_the_backend_ignores_accents(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, |s| {
        s.http.account_ids = palisade::model::AccountIds::AccentInsensitive;
    })
    .await
    .unwrap();
    let spellings = [
        "victim@example.com",
        "v\u{ed}ctim@example.com",
        "v\u{130}ctim@example.com",
        "victim@example\u{3002}com",
        "VI\u{301}CTIM@\u{c9}XAMPLE.COM",
    ];
    ten_failures_lock_one_account(&app, &spellings, "ai", "victim@example.com").await;
    let blocked = app
        .limit_check(&check(
            "/login",
            "v\u{ee}ctim@example\u{ff61}com",
            "198.51.100.1",
        ))
        .await;
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Ten failed logins spelled in turn as `spellings` lock exactly one account, `canonical`.
async fn ten_failures_lock_one_account(
    app: &TestApp,
    spellings: &[&str],
    ids: &str,
    canonical: &str,
) {
    let events: Vec<Value> = (0..10)
        .map(|i| {
            json!({"event_id": format!("{ids}-{i}"), "type": "login_failure",
                   "account": spellings[i % spellings.len()], "ip": "203.0.113.50"})
        })
        .collect();
    let response = post_events(app, Value::Array(events)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    let decisions = body["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 1, "one account: {body}");
    assert_eq!(decisions[0]["account"], canonical);
    assert_eq!(decisions[0]["action"], "lockout");
}

async fn account_spellings_are_one_account_everywhere(app: TestApp) {
    let spellings = [
        "alice@example.com",
        "Alice@Example.com",
        "ALICE@EXAMPLE.COM",
        " alice@example.com ",
        "\u{ff41}\u{ff4c}\u{ff49}\u{ff43}\u{ff45}@example.com",
    ];
    ten_failures_lock_one_account(&app, &spellings, "sp", "alice@example.com").await;
    // The status of any spelling is the lockout.
    for spelling in ["ALICE@example.com", "%EF%BD%81lice@example.com"] {
        let status: Value = app
            .get(
                &format!("/v1/accounts/{spelling}/status?ip=198.51.100.1"),
                Some(ADMIN_TOKEN),
            )
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(status["action"], "lockout", "{spelling}: {status}");
        assert_eq!(status["account"], "alice@example.com");
    }
    // The limiter's auth budget of the account is blocked for a stranger, whatever the case.
    let blocked = app
        .limit_check(&check("/login", "Alice@EXAMPLE.com", "198.51.100.1"))
        .await;
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    // The analyst searches by any spelling and sees the spelling each event came in.
    let page: Value = app
        .get(
            "/v1/lockouts?account=ALICE%40Example.COM",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!(items[0]["account"], "alice@example.com");
    let id = items[0]["id"].as_str().unwrap();
    let detail: Value = app
        .get(&format!("/v1/lockouts/{id}"), Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let events = detail["events"].as_array().unwrap();
    assert_eq!(events.len(), 10);
    assert!(events.iter().all(|e| e["account"] == "alice@example.com"));
    let received: Vec<&str> = events
        .iter()
        .filter_map(|e| e["account_received"].as_str())
        .collect();
    assert_eq!(
        received.len(),
        8,
        "the two canonical spellings carry none: {detail}"
    );
    assert!(received.contains(&"ALICE@EXAMPLE.COM"));
    // A list entry for an account is stored by its canonical id.
    let entry = app
        .post(
            "/v1/lists/deny",
            Some(ADMIN_TOKEN),
            &json!({"value": "Mallory@Example.com", "kind": "account", "reason": "fraud ring"}),
        )
        .await;
    assert_eq!(entry.status(), StatusCode::CREATED);
    let entry: Value = entry.json().await.unwrap();
    assert_eq!(entry["value"], "mallory@example.com");
    let denied = app
        .limit_check(&json!({"endpoint": "/v1/feed", "ip": "198.51.100.2", "user_id": "MALLORY@example.com"}))
        .await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Zero-width characters, bidi controls and control characters make an id that looks like
/// the victim's but counts apart: refused with 400 at every entry point.
async fn invisible_and_control_characters_in_ids_are_refused(app: TestApp) {
    for account in [
        "ali\u{200b}ce",
        "\u{202e}ecila",
        "ali\u{ad}ce",
        "ali\u{7}ce",
    ] {
        let response = post_events(
            &app,
            json!([{"event_id": "inv-1", "type": "login_failure", "account": account, "ip": "203.0.113.1"}]),
        )
        .await;
        let body = assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        assert!(
            body["error"]["details"].to_string().contains("account"),
            "{account:?}: {body}"
        );
        let response = app
            .limit_check(&check("/login", account, "203.0.113.1"))
            .await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    let response = app
        .limit_check(
            &json!({"endpoint": "/login", "ip": "203.0.113.1", "device_id": "dev\u{200d}1"}),
        )
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let response = app
        .get(
            "/v1/accounts/ali%E2%80%8Bce/status?ip=203.0.113.1",
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

/// Lockout DoS: a stranger who knows the victim's account name posts 30 failures to lock it.
/// The owner, on the device and network they logged in from before, keeps access at the
/// limiter (answered with a challenge for a step-up) while the attack goes on; the attacker's
/// contexts stay locked out. The same rule answers `/status`, forward-auth and the limit check.
async fn a_stranger_cannot_lock_the_owner_out_at_the_limiter(app: TestApp) {
    let owner = json!({"event_id": "own-1", "type": "login_success", "account": "victim@example.com",
                       "ip": "198.51.100.10", "device_id": "owner-phone"});
    assert_eq!(
        post_events(&app, json!([owner])).await.status(),
        StatusCode::OK
    );
    let attack = |from: usize| -> Value {
        (from..from + 15)
            .map(|i| {
                json!({"event_id": format!("atk-{i}"), "type": "login_failure",
                       "account": "Victim@Example.com", "ip": format!("203.0.113.{}", i % 200)})
            })
            .collect()
    };
    let locked = post_events(&app, attack(0)).await;
    let locked: Value = locked.json().await.unwrap();
    assert_eq!(locked["decisions"][0]["action"], "lockout", "{locked}");

    // Asked without taking tokens: the owner's own auth budget (5 a minute, halved by the
    // failures' challenge factor) is not what this test is about.
    let login = |ip: &str, device: Option<&str>| {
        let mut body = check("/auth/login", "victim@example.com", ip);
        body["consume"] = json!(false);
        if let Some(device) = device {
            body["device_id"] = json!(device);
        }
        body
    };
    // The owner's phone, and a new address of the owner's home network without a device id.
    for (ip, device) in [
        ("198.51.100.10", Some("owner-phone")),
        ("198.51.100.99", None),
        ("192.0.2.200", Some("owner-phone")),
    ] {
        let response = app.limit_check(&login(ip, device)).await;
        assert_eq!(response.status(), StatusCode::OK, "{ip} {device:?}");
        assert_eq!(response.headers()["x-palisade-challenge"], "known_context");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["challenge"]["code"], "known_context", "{body}");
        assert!(body["challenge"]["lockout_id"].is_string());
    }
    // Strangers: another network, another device.
    for (ip, device) in [
        ("203.0.113.5", None),
        ("203.0.113.6", Some("attacker-phone")),
    ] {
        let response = app.limit_check(&login(ip, device)).await;
        let body = assert_envelope(response, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
        assert_eq!(body["error"]["details"]["scope"], "endpoint_user");
    }
    // The attack goes on and the owner logs in again: still through, still challenged.
    assert_eq!(
        post_events(&app, attack(100)).await.status(),
        StatusCode::OK
    );
    let again = json!({"event_id": "own-2", "type": "login_success", "account": "victim@example.com",
                       "ip": "198.51.100.10", "device_id": "owner-phone"});
    assert_eq!(
        post_events(&app, json!([again])).await.status(),
        StatusCode::OK
    );
    let response = app
        .limit_check(&login("198.51.100.10", Some("owner-phone")))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    // Forward-auth answers the same for the owner's context, and the stranger's.
    let forward = |ip: &'static str, device: &'static str| {
        app.client
            .get(app.url("/v1/forward-auth"))
            .bearer_auth(ADMIN_TOKEN)
            .header("x-forwarded-method", "POST")
            .header("x-forwarded-uri", "/auth/login")
            .header("x-forwarded-for", ip)
            .header("x-user-id", "victim@example.com")
            .header("x-device-id", device)
            .send()
    };
    let owner = forward("198.51.100.10", "owner-phone").await.unwrap();
    assert_eq!(owner.status(), StatusCode::OK);
    assert_eq!(owner.headers()["x-palisade-challenge"], "known_context");
    let stranger = forward("203.0.113.9", "other").await.unwrap();
    assert_eq!(stranger.status(), StatusCode::TOO_MANY_REQUESTS);
    // And `/status` agrees.
    let status: Value = app
        .get(
            "/v1/accounts/victim@example.com/status?ip=198.51.100.42",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["action"], "challenge", "{status}");
    let status: Value = app
        .get(
            "/v1/accounts/victim@example.com/status?ip=203.0.113.42",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["action"], "lockout", "{status}");
}

/// Quick login: a script failing faster than a human types is challenged after two
/// failures, however it dates them: no timestamps at all, one second-resolution timestamp
/// for both, out of order, or one failure dated into the future so that the fast ones look
/// far from it. Failures at a human's pace are not.
async fn the_quick_login_signal_cannot_be_dodged(app: TestApp) {
    let now = app.app.clock.now_ms();
    let at = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(now + ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    // What an auth service logging whole seconds sends for two failures 0.6 s apart.
    let second = (now - 10_000).div_euclid(1000) * 1000;
    let at_second = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(second + ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let event = |account: &str, id: &str, ts: Option<String>| {
        let mut e = json!({"event_id": id, "type": "login_failure", "account": account,
                           "ip": "203.0.113.66"});
        if let Some(ts) = ts {
            e["ts"] = json!(ts);
        }
        e
    };
    let action = |answer: &Value| {
        answer["decisions"][0]["action"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let codes = |answer: &Value| -> Vec<String> {
        answer["decisions"][0]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["code"].as_str().unwrap().to_owned())
            .collect()
    };
    let post = |events: Value| async {
        let response = post_events(&app, events).await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json::<Value>().await.unwrap()
    };
    // A human's pace: 2 s and more apart.
    let human = post(json!([
        event("pace", "p1", Some(at(-20_000))),
        event("pace", "p2", Some(at(-16_000))),
        event("pace", "p3", Some(at(-12_000))),
    ]))
    .await;
    assert_eq!(action(&human), "none", "{human}");
    for (case, events) in [
        (
            "no timestamps",
            json!([event("no-ts", "n1", None), event("no-ts", "n2", None)]),
        ),
        (
            "one second for both",
            json!([
                event("same-s", "s1", Some(at_second(100))),
                event("same-s", "s2", Some(at_second(700)))
            ]),
        ),
    ] {
        let answer = post(events).await;
        assert_eq!(action(&answer), "challenge", "{case}: {answer}");
        assert!(
            codes(&answer).contains(&"faster_than_human".to_owned()),
            "{case}: {answer}"
        );
    }
    // A failure dated 299 s ahead, then one at once: the date counts as the time of
    // receipt, so the two are an instant apart.
    let ahead = post(json!([event("future", "f1", Some(at(299_000)))])).await;
    assert_eq!(action(&ahead), "none", "{ahead}");
    let next = post(json!([event("future", "f2", None)])).await;
    assert_eq!(action(&next), "challenge", "{next}");
    // Out of order, across batches: 0 s and 10 s first, then 0.4 s.
    let first = post(json!([
        event("order", "o1", Some(at(-30_000))),
        event("order", "o2", Some(at(-20_000))),
    ]))
    .await;
    assert_eq!(action(&first), "none", "{first}");
    let late = post(json!([event("order", "o3", Some(at(-29_600)))])).await;
    assert_eq!(action(&late), "challenge", "{late}");
    // The status says so too, as long as those failures are in the window.
    let status: Value = app
        .get(
            "/v1/accounts/order/status?ip=203.0.113.66",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["action"], "challenge", "{status}");
}

/// Idempotency compares content: an exact retry is a duplicate; an `event_id` stored before
/// for another account (or type) is a 409 naming the event, nothing of its batch is stored,
/// and the windows do not count it (such a reuse once locked an account with no events).
async fn a_reused_event_id_with_other_content_is_a_conflict_and_counts_nothing(app: TestApp) {
    let now = app.app.clock.now_ms();
    let failure = |id: usize, account: &str| {
        json!({"event_id": format!("reuse-{id}"), "type": "login_failure", "account": account,
               "ip": "203.0.113.30",
               "ts": chrono::DateTime::from_timestamp_millis(now - 60_000 + id as i64 * 2_000)
                   .unwrap().to_rfc3339()})
    };
    let first: Vec<Value> = (0..10).map(|i| failure(i, "original")).collect();
    let response = post_events(&app, Value::Array(first.clone())).await;
    assert_eq!(response.status(), StatusCode::OK);
    // An exact retry: duplicates, nothing counted twice.
    let retry: Value = post_events(&app, Value::Array(first))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (retry["accepted"].as_u64(), retry["duplicates"].as_u64()),
        (Some(0), Some(10))
    );
    // The same ids for another account, beside a new event: 409, nothing stored.
    let mut reused: Vec<Value> = (0..10).map(|i| failure(i, "bystander")).collect();
    reused.push(failure(99, "bystander"));
    let response = post_events(&app, Value::Array(reused)).await;
    let body = assert_envelope(response, StatusCode::CONFLICT, "CONFLICT").await;
    let errors = body["error"]["details"]["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 10, "{body}");
    assert_eq!(errors[0]["index"], 0);
    assert!(
        errors[0]["reason"].as_str().unwrap().contains("account"),
        "{body}"
    );
    let status: Value = app
        .get(
            "/v1/accounts/bystander/status?ip=203.0.113.30",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["failures_in_window"], 0, "{status}");
    assert_eq!(status["action"], "none", "{status}");
    let original: Value = app
        .get(
            "/v1/accounts/original/status?ip=203.0.113.30",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(original["failures_in_window"], 10, "{original}");
    // A type changed under the same id is a conflict too.
    let mut success = failure(3, "original");
    success["type"] = json!("login_success");
    let response = post_events(&app, json!([success])).await;
    assert_envelope(response, StatusCode::CONFLICT, "CONFLICT").await;
    // The new event alone is stored.
    let alone = post_events(&app, json!([failure(99, "bystander")])).await;
    assert_eq!(alone.status(), StatusCode::OK);
    let page: Value = app
        .get(
            "/v1/lockouts?account=bystander&status=all",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert!(page["items"].as_array().unwrap().is_empty(), "{page}");
}
