//! Budgets per recipient and per destination on the endpoints that make the backend send
//! something (`messaging`: OTPs, invitations; `push`), on both backends: every spelling of a
//! phone number, e-mail address or push token is one recipient, through the JSON check,
//! forward-auth and Envoy alike.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::gateways::{Envoy, descriptor, forward};
use crate::helpers::{ADMIN_TOKEN, TestApp};
use crate::on_both_backends;

on_both_backends!(
    one_phone_number_spelled_many_ways_gets_three_otps,
    one_mailbox_and_one_push_token_are_one_recipient,
    a_destination_prefix_has_a_budget_tightened_for_premium_rate,
    forward_auth_and_envoy_name_the_recipient,
    a_recipient_that_is_not_one_is_refused_with_a_reason,
    a_destination_whose_codes_stop_being_verified_is_tightened_until_cleared,
    delivery_events_are_checked_and_stored_once,
    an_instance_that_starts_counts_the_stored_deliveries,
);

async fn on_gb(app: TestApp) -> TestApp {
    TestApp::spawn_with(app.backend, |s| {
        s.messaging.default_region = "GB".to_owned();
    })
    .await
    .expect("the backend exists")
}

pub(crate) fn otp(ip: &str, recipient: &str) -> Value {
    json!({"endpoint": "/otp/send", "method": "POST", "ip": ip, "recipient": recipient})
}

pub(crate) async fn reason(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    (status, response.json().await.unwrap())
}

async fn one_phone_number_spelled_many_ways_gets_three_otps(app: TestApp) {
    let app = on_gb(app).await;
    // Three OTPs from three addresses, each spelling the number its own way.
    for (ip, spelling) in [
        ("192.0.2.1", "+44 7700 900123"),
        ("192.0.2.2", "00447700900123"),
        ("192.0.2.3", "07700 900123"),
    ] {
        let (status, body) = reason(app.limit_check(&otp(ip, spelling)).await).await;
        assert_eq!(status, StatusCode::OK, "{spelling}: {body}");
        assert_eq!(body["class"], "messaging", "{body}");
    }
    // A fourth, from yet another address and spelling, meets the number's budget.
    for spelling in ["tel:+44-7700-900-123", "(07700) 900123", "+447700900123"] {
        let (status, body) = reason(app.limit_check(&otp("192.0.2.9", spelling)).await).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{spelling}: {body}");
        let details = &body["error"]["details"];
        assert_eq!(details["reason"], "recipient_rate", "{body}");
        assert_eq!(details["budget"], "otp-recipient", "{body}");
        assert_eq!(details["scope"], "recipient", "{body}");
    }
    // Another number is untouched, and checking the code is `auth`, not `messaging`.
    let (status, _) = reason(app.limit_check(&otp("192.0.2.9", "+44 7700 900456")).await).await;
    assert_eq!(status, StatusCode::OK);
    let (_, body) = reason(
        app.limit_check(&json!({"endpoint": "/otp/verify", "method": "POST", "ip": "192.0.2.9"}))
            .await,
    )
    .await;
    assert_eq!(body["class"], "auth", "{body}");
}

async fn one_mailbox_and_one_push_token_are_one_recipient(app: TestApp) {
    for spelling in [
        "J.Doe@gmail.com",
        "jdoe+promo@googlemail.com",
        "mailto:JDOE@GMAIL.COM",
    ] {
        let (status, body) = reason(app.limit_check(&otp("192.0.2.20", spelling)).await).await;
        assert_eq!(status, StatusCode::OK, "{spelling}: {body}");
    }
    let (status, body) = reason(
        app.limit_check(&otp("192.0.2.21", "j.d.o.e@gmail.com"))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "recipient_rate");
    // Elsewhere a dot is part of the mailbox.
    for spelling in ["j.doe@example.com", "jdoe@example.com"] {
        let (status, _) = reason(app.limit_check(&otp("192.0.2.22", spelling)).await).await;
        assert_eq!(status, StatusCode::OK, "{spelling}");
    }
    // Ten pushes an hour to one token, whoever asks.
    let token = "fcm:APA91bHPRgkF3JUikC4ENAHEeMrd41Zxv3hVZjC9KtT8OvPVGJ-hQMRKRrZuJAEcl7B338";
    let push = |i: usize, token: &str| {
        json!({"endpoint": "/push/send", "method": "POST", "ip": format!("198.51.100.{i}"),
            "user_id": format!("sender-{i}"), "recipient": token})
    };
    for i in 0..10 {
        let (status, body) = reason(app.limit_check(&push(i, token)).await).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["class"], "push");
    }
    let (status, body) = reason(app.limit_check(&push(11, &format!("push:{token}"))).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["details"]["budget"], "push-recipient");
    // The token itself is nowhere in the answer.
    assert!(!body.to_string().contains("APA91"), "{body}");
}

async fn a_destination_prefix_has_a_budget_tightened_for_premium_rate(app: TestApp) {
    let app = TestApp::spawn_with(app.backend, |s| {
        s.messaging.default_region = "GB".to_owned();
        // 20 an hour per destination, so a tenth is 2.
        let budget = s
            .limits
            .budgets
            .iter_mut()
            .find(|b| b.name == "otp-destination")
            .unwrap();
        budget.limit = 20;
    })
    .await
    .expect("the backend exists");
    // Premium-rate numbers (09xx in the UK): 2 messages to the whole range, from anyone.
    for n in 0..2 {
        let number = format!("+44 909 876 54{n:02}");
        let (status, body) = reason(
            app.limit_check(&otp(&format!("192.0.2.{n}"), &number))
                .await,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{number}: {body}");
    }
    let (status, body) = reason(
        app.limit_check(&otp("192.0.2.50", "+44 909 876 5499"))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let details = &body["error"]["details"];
    assert_eq!(details["reason"], "destination_rate", "{body}");
    assert_eq!(details["limit"], 2, "{body}");
    // Ordinary mobiles of another range are not touched: 20 different numbers pass, the 21st
    // of the same range does not.
    for n in 0..20 {
        let number = format!("+44 7700 9001{n:02}");
        let (status, body) = reason(app.limit_check(&otp("203.0.113.1", &number)).await).await;
        assert_eq!(status, StatusCode::OK, "{number}: {body}");
    }
    let (status, body) = reason(
        app.limit_check(&otp("203.0.113.2", "+44 7700 900199"))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "destination_rate");
    assert_eq!(body["error"]["details"]["limit"], 20);
}

async fn forward_auth_and_envoy_name_the_recipient(app: TestApp) {
    let app = on_gb(app).await;
    let headers = |ip: &'static str, recipient: &'static str| {
        [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/otp/send"),
            ("x-forwarded-for", ip),
            ("x-palisade-recipient", recipient),
        ]
    };
    for (ip, recipient) in [
        ("192.0.2.31", "+44 7700 900777"),
        ("192.0.2.32", "07700900777"),
    ] {
        let response = forward(&app, Some(ADMIN_TOKEN), "", &headers(ip, recipient)).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    // Envoy: a descriptor with the `recipient` entry is answered by the recipient's budget.
    let mut envoy = Envoy::start(&app).await;
    let request = palisade::api::envoy::proto::RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![
            descriptor(&[("remote_address", "192.0.2.33")]),
            descriptor(&[("path", "/otp/send"), ("method", "POST")]),
            descriptor(&[("recipient", "tel:+447700900777")]),
        ],
        hits_addend: 0,
    };
    let answer = envoy
        .call(Some(ADMIN_TOKEN), request.clone())
        .await
        .unwrap();
    assert_eq!(
        answer.overall_code,
        palisade::api::envoy::proto::Code::Ok as i32
    );
    assert_eq!(answer.statuses[2].limit_remaining, 0, "the third of three");
    let answer = envoy.call(Some(ADMIN_TOKEN), request).await.unwrap();
    assert_eq!(
        answer.overall_code,
        palisade::api::envoy::proto::Code::OverLimit as i32
    );
    let limit = answer.statuses[2].current_limit.as_ref().unwrap();
    assert_eq!(limit.name, "otp-recipient");
    // And forward-auth refuses the same number spelled once more.
    let response = forward(
        &app,
        Some(ADMIN_TOKEN),
        "",
        &headers("192.0.2.34", "0044 7700 900777"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
}

async fn a_recipient_that_is_not_one_is_refused_with_a_reason(app: TestApp) {
    for (recipient, says) in [
        ("07700 900123", "messaging.default_region"),
        ("+44 12", "not a"),
        ("bob@@example.com", "not an e-mail address"),
        ("", "1–512 characters"),
    ] {
        let (status, body) = reason(app.limit_check(&otp("192.0.2.40", recipient)).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{recipient:?}: {body}");
        assert_eq!(body["error"]["code"], "INVALID_ARGUMENT", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{recipient:?}: {message}");
    }
}

fn at(app: &TestApp, ago_ms: i64) -> String {
    palisade::clock::rfc3339(app.app.clock.now_ms() - ago_ms)
}

async fn deliveries(app: &TestApp, events: Vec<Value>) -> (StatusCode, Value) {
    reason(
        app.post(
            "/v1/events/messaging",
            Some(ADMIN_TOKEN),
            &json!({ "events": events }),
        )
        .await,
    )
    .await
}

/// `n` codes sent to numbers of `range` (`+44 7700 9001`), `verified` of them verified, all
/// `ago_ms` before now (negative: ahead).
fn window(
    app: &TestApp,
    tag: &str,
    range: &str,
    n: usize,
    verified: usize,
    ago_ms: i64,
) -> Vec<Value> {
    let mut events = Vec::new();
    for i in 0..n {
        let recipient = format!("{range}{i:02}");
        events.push(
            json!({"event_id": format!("{tag}-sent-{i}"), "type": "otp_sent",
            "recipient": recipient, "ts": at(app, ago_ms - i as i64)}),
        );
        if i < verified {
            events.push(
                json!({"event_id": format!("{tag}-ok-{i}"), "type": "otp_verified",
                "recipient": recipient, "ts": at(app, ago_ms - i as i64)}),
            );
        }
    }
    events
}

/// Codes allowed to the range before one is refused for its destination (at most `max`).
/// A pumped range (`+44 7700 9001xx`: 40 codes, 1 verified, 20 minutes ago; then a code
/// now closes its window) tightens `destination:+44770`: its 100 codes an hour are 10,
/// whoever asks, and they are spent here. Needs one-minute conversion windows.
pub(crate) async fn pump_the_uk_770_range(app: &TestApp) {
    let mut events = window(app, "pumped", "+44 7700 9001", 40, 1, 1_200_000);
    events.extend(window(app, "pumped-now", "+44 7700 9002", 1, 0, 0));
    let (status, body) = deliveries(app, events).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tightened"], json!(["destination:+44770"]), "{body}");
    assert_eq!(codes_until_refused(app, "+44 7700 9003", 50).await, 10);
}

/// `check` is refused by its destination's budget.
pub(crate) async fn refused_by_destination(app: &TestApp, check: &Value) {
    let (status, body) = reason(app.limit_check(check).await).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(
        body["error"]["details"]["reason"], "destination_rate",
        "{body}"
    );
}

async fn codes_until_refused(app: &TestApp, range: &str, max: usize) -> usize {
    for i in 0..max {
        let check = otp(
            &format!("203.0.113.{}", i % 200),
            &format!("{range}{:02}", i % 100),
        );
        let (status, body) = reason(app.limit_check(&check).await).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(
                body["error"]["details"]["reason"], "destination_rate",
                "{body}"
            );
            return i;
        }
    }
    max
}

async fn a_destination_whose_codes_stop_being_verified_is_tightened_until_cleared(app: TestApp) {
    // One-minute windows: an event two minutes ahead closes the window of now.
    let app = TestApp::spawn_with(app.backend, |s| s.messaging.conversion.window_s = 60)
        .await
        .expect("the backend exists");
    // An honest range: 30 codes, 25 verified, 20 minutes ago; then a code now closes it.
    let mut events = window(&app, "honest", "+44 7911 1234", 30, 25, 1_200_000);
    events.extend(window(&app, "honest-now", "+44 7911 1235", 1, 1, 0));
    let (status, body) = deliveries(&app, events).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["stored"], 57);
    assert_eq!(body["tightened"], json!([]));
    pump_the_uk_770_range(&app).await;
    // The honest range keeps its 100.
    assert_eq!(codes_until_refused(&app, "+44 7911 2000", 50).await, 50);
    // The owner of a phone the account signed in from before still gets a code there; a
    // new device of the same account does not.
    app.post_auth(vec![
        json!({"event_id": "alice-home", "type": "login_success",
        "account": "alice", "ip": "192.0.2.77", "device_id": "alice-phone"}),
    ])
    .await;
    let mut known = otp("192.0.2.78", "+44 7700 900555");
    known["user_id"] = json!("alice");
    known["device_id"] = json!("alice-phone");
    let (status, body) = reason(app.limit_check(&known).await).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    known["device_id"] = json!("a-new-phone");
    refused_by_destination(&app, &known).await;
    // One alert for the incident, however often it collapses while tightened.
    let mut again = window(&app, "pumped-2", "+44 7700 9004", 40, 0, 0);
    again.extend(window(
        &app,
        "pumped-2-ahead",
        "+44 7700 9005",
        1,
        0,
        -120_000,
    ));
    let (_, body) = deliveries(&app, again).await;
    assert_eq!(body["tightened"], json!(["destination:+44770"]), "{body}");
    let alerts: Value = app
        .get("/v1/alerts?limit=50", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    let conversion: Vec<&Value> = alerts["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "otp_conversion")
        .collect();
    assert_eq!(conversion.len(), 1, "{alerts}");
    assert_eq!(conversion[0]["subject"], "destination:+44770");
    assert!(
        conversion[0]["message"]
            .as_str()
            .unwrap()
            .contains("1 of 40 codes verified"),
        "{alerts}"
    );
    // An analyst clears it, naming the destination or any number in it.
    let cleared = app
        .post(
            "/v1/penalties/clear",
            Some(ADMIN_TOKEN),
            &json!({"destination": "+44 7700 900999", "reason": "carrier confirmed an outage"}),
        )
        .await;
    let (status, body) = reason(cleared).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["subject"], "destination:+44770");
    assert_eq!(body["cleared"], json!(["messaging:otp_conversion"]));
    // The destination's budget is its 100 again (what it spent at a tenth still counts).
    let (status, body) = reason(
        app.limit_check(&otp("203.0.113.250", "+44 7700 900600"))
            .await,
    )
    .await;
    let limit = if status == StatusCode::OK {
        assert_eq!(body["budget"], "otp-destination", "{body}");
        &body["limit"]
    } else {
        assert_eq!(
            body["error"]["details"]["budget"], "otp-destination",
            "{body}"
        );
        &body["error"]["details"]["limit"]
    };
    assert_eq!(limit, 100, "{body}");
}

async fn delivery_events_are_checked_and_stored_once(app: TestApp) {
    let good = json!({"event_id": "d-1", "type": "otp_sent", "recipient": "+44 7700 900123"});
    let (status, body) = deliveries(
        &app,
        vec![
            good.clone(),
            json!({"event_id": "d-2", "type": "otp_opened", "recipient": "+44 7700 900123"}),
            json!({"event_id": "d-3", "type": "otp_sent", "recipient": "tel:not a number"}),
            json!({"event_id": "d-4", "type": "otp_sent", "recipient": "+44 7700 900123",
                "ts": "2001-01-01T00:00:00Z"}),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let indexes: Vec<u64> = body["error"]["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [1, 2, 3], "{body}");
    // Nothing was stored: the good event is new on the next call, and a retry is not.
    for expected in [1, 0] {
        let (status, body) = deliveries(&app, vec![good.clone()]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["stored"], expected, "{body}");
    }
    let (status, _) = reason(
        app.post(
            "/v1/events/messaging",
            Some(ADMIN_TOKEN),
            &json!({"events": []}),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// The conversion windows are counted again from the stored deliveries when an instance
/// starts: the pumped window reported to one instance collapses on another started after it,
/// when that one is told of the next window.
async fn an_instance_that_starts_counts_the_stored_deliveries(app: TestApp) {
    let app = TestApp::spawn_with(app.backend, |s| s.messaging.conversion.window_s = 60)
        .await
        .expect("the backend exists");
    let (status, body) = deliveries(
        &app,
        window(&app, "before", "+44 7700 9001", 40, 1, 1_200_000),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tightened"], json!([]), "the window is still open");
    let later = app.another_instance().await;
    let (status, body) =
        deliveries(&later, window(&later, "after", "+44 7700 9002", 1, 0, 0)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tightened"], json!(["destination:+44770"]), "{body}");
}
