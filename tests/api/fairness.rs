//! Fairness: many honest users behind one address (carrier NAT), the `ip_device` scope, and
//! the reason codes a refused app can show.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_envelope};
use crate::on_both_backends;

on_both_backends!(
    many_accounts_logging_in_make_an_address_shared_and_each_device_gets_its_own_budget,
    a_shared_address_has_an_ip_wide_ceiling,
    a_crowd_of_known_phones_behind_one_address_is_not_refused_by_its_ceiling,
    a_configured_range_is_shared_from_the_first_request,
    an_ip_device_budget_counts_each_device_on_each_address,
    spraying_from_a_shared_address_needs_more_evidence,
    refusals_carry_a_stable_reason_code,
    spraying_from_rotating_addresses_of_one_slash_24_blocks_the_network,
    spraying_from_rotating_slash_64s_of_one_slash_48_blocks_the_network,
    spraying_from_rotating_networks_of_one_asn_blocks_the_asn,
    a_few_accounts_failing_across_an_asn_make_it_suspected,
    a_busy_carrier_network_with_more_successes_is_not_spraying,
    stuffing_spread_over_many_networks_turns_the_login_guard_on,
    a_first_sign_in_under_the_guard_is_challenged_and_passing_makes_it_known,
    unknown_contexts_are_refused_when_the_policy_says_refuse,
    accounts_a_budget_refused_count_as_spraying_evidence,
    a_forced_re_login_of_every_user_leaves_the_guard_off,
    a_network_block_is_renewed_while_its_spraying_goes_on,
);

const NAT: &str = "198.51.100.77";

fn login(user: &str, ip: &str, device: Option<&str>) -> Value {
    let mut body = json!({"endpoint": "/auth/login", "method": "POST", "ip": ip, "user_id": user});
    if let Some(device) = device {
        body["device_id"] = json!(device);
    }
    body
}

/// `n` accounts log in successfully from `ip`, each from its own device.
async fn successes(app: &TestApp, ip: &str, n: usize) {
    let events: Vec<Value> = (0..n)
        .map(|i| {
            json!({"event_id": format!("ok-{ip}-{i}"), "type": "login_success",
                   "account": format!("user{i}"), "ip": ip, "device_id": format!("phone{i}")})
        })
        .collect();
    app.post_auth(events).await;
}

async fn status_of(app: &TestApp, body: &Value) -> (StatusCode, Value) {
    let response = app.limit_check(body).await;
    let status = response.status();
    (status, response.json().await.unwrap())
}

/// How a login was stopped: the 429's reason code, or the challenge it passes on (its code;
/// a login challenge carries an id). None: it passed freely.
async fn stopped(app: &TestApp, body: &Value) -> Option<String> {
    let (status, body) = status_of(app, body).await;
    let code = match status {
        StatusCode::TOO_MANY_REQUESTS => &body["error"]["details"]["reason"],
        StatusCode::OK if body["challenge"].is_null() => return None,
        StatusCode::OK => {
            let id = &body["challenge"]["id"];
            let login_challenge = body["challenge"]["code"] != "known_context";
            assert_eq!(id.is_string(), login_challenge, "{body}");
            &body["challenge"]["code"]
        }
        other => panic!("{other}: {body}"),
    };
    Some(code.as_str().unwrap_or_else(|| panic!("{body}")).to_owned())
}

async fn many_accounts_logging_in_make_an_address_shared_and_each_device_gets_its_own_budget(
    app: TestApp,
) {
    // Not shared yet: the address's auth budget (10/min) is everyone's.
    for i in 0..10 {
        let (status, _) = status_of(&app, &login(&format!("a{i}"), NAT, Some("d0"))).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = status_of(&app, &login("a10", NAT, Some("d1"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["details"]["scope"], "endpoint_ip");
    assert_eq!(body["error"]["details"]["reason"], "ip_rate");

    // 19 accounts are not enough; the 20th makes it shared.
    successes(&app, NAT, 19).await;
    let (status, _) = status_of(&app, &login("b0", NAT, Some("d2"))).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "19 accounts: not shared"
    );
    successes(&app, NAT, 20).await;
    let shared = app.app.scoring.shared_ips().marked();
    assert_eq!(shared.len(), 1, "{shared:?}");
    assert_eq!(shared[0].0, format!("ip:{NAT}"));

    // Each device behind it now has the address's budget to itself, scaled by what is
    // known of the device (unattested: 0.25 on auth): 30 devices × 2.
    for device in 0..30 {
        for attempt in 0..2 {
            let user = format!("u{device}-{}", attempt % 2);
            let (status, body) =
                status_of(&app, &login(&user, NAT, Some(&format!("dev{device}")))).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "device {device} attempt {attempt}: {body}"
            );
        }
    }
    let (status, body) = status_of(&app, &login("u0-9", NAT, Some("dev0"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["details"]["scope"], "ip_device");
    assert_eq!(body["error"]["details"]["limit"], 2);
    assert_eq!(body["error"]["details"]["reason"], "device_untrusted");

    // Without a device id the strict budget of the address stands (spent above).
    let (status, body) = status_of(&app, &login("nodevice", NAT, None)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["details"]["scope"], "endpoint_ip");

    // Another address is untouched by all this.
    let (status, _) = status_of(&app, &login("elsewhere", "203.0.113.5", Some("dev0"))).await;
    assert_eq!(status, StatusCode::OK);
}

async fn a_shared_address_has_an_ip_wide_ceiling(app: TestApp) {
    let app = TestApp::spawn_with(app.backend, |settings| {
        settings.limits.shared_ip.ceiling = 2.0;
    })
    .await
    .unwrap();
    successes(&app, NAT, 20).await;
    // 2 × 10 auth attempts for the whole address, whatever the devices.
    for device in 0..20 {
        let (status, body) = status_of(
            &app,
            &login(&format!("c{device}"), NAT, Some(&format!("x{device}"))),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{device}: {body}");
    }
    let (status, body) = status_of(&app, &login("c99", NAT, Some("x99"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["details"]["reason"], "ip_shared_limit");
    assert_eq!(body["error"]["details"]["limit"], 20);
}

/// A push notification reaches a carrier's customers behind one address: every one logs in
/// with the phone they signed in with before, within seconds. Other people's traffic filled
/// the address-wide ceiling, but a login from a device its account knows is never refused by
/// it; the ceiling still binds strangers and known accounts on unknown devices.
async fn a_crowd_of_known_phones_behind_one_address_is_not_refused_by_its_ceiling(app: TestApp) {
    let app = TestApp::spawn_with(app.backend, |settings| {
        settings.limits.shared_ip.ceiling = 2.0;
    })
    .await
    .unwrap();
    // 60 customers signed in from the address before, each with their phone.
    successes(&app, NAT, 60).await;
    // Strangers spend the ceiling (2 × 10 a minute) first, and meet it.
    let mut strangers = Vec::new();
    for i in 0..30 {
        let (status, _) = status_of(
            &app,
            &login(&format!("new{i}"), NAT, Some(&format!("new-phone{i}"))),
        )
        .await;
        strangers.push(status.as_u16());
    }
    assert_eq!(
        strangers.iter().filter(|s| **s == 200).count(),
        20,
        "{strangers:?}"
    );
    let mut refused = Vec::new();
    for i in 0..60 {
        let (status, body) = status_of(
            &app,
            &login(&format!("user{i}"), NAT, Some(&format!("phone{i}"))),
        )
        .await;
        if status != StatusCode::OK {
            refused.push((i, body["error"]["details"]["reason"].clone()));
        }
    }
    assert!(refused.is_empty(), "known phones refused: {refused:?}");
    // The ceiling (2 × 10 a minute) is spent for everyone else.
    let (status, body) = status_of(&app, &login("newcomer", NAT, Some("new-phone"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "ip_shared_limit");
    let (status, body) = status_of(&app, &login("user1", NAT, Some("someone-elses-phone"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "ip_shared_limit");
}

async fn a_configured_range_is_shared_from_the_first_request(app: TestApp) {
    // RFC 6598 space is shared by default: no successes needed.
    for device in 0..15 {
        let (status, body) = status_of(
            &app,
            &login(
                &format!("r{device}"),
                "100.64.1.2",
                Some(&format!("p{device}")),
            ),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{device}: {body}");
        assert_ne!(body["scope"], "endpoint_ip", "{body}");
    }
    // Turned off, the same traffic meets the address's budget.
    let strict = TestApp::spawn_with(app.backend, |settings| {
        settings.limits.shared_ip.enabled = false;
    })
    .await
    .unwrap();
    let mut refused = 0;
    for device in 0..15 {
        let body = login(
            &format!("r{device}"),
            "100.64.1.2",
            Some(&format!("p{device}")),
        );
        if strict.limit_check(&body).await.status() == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    assert_eq!(refused, 5);
}

async fn an_ip_device_budget_counts_each_device_on_each_address(app: TestApp) {
    let app = TestApp::spawn_with(app.backend, |settings| {
        settings
            .limits
            .budgets
            .push(palisade::config::BudgetSettings {
                name: "otp-ipdev".to_owned(),
                scope: palisade::config::ScopeKind::IpDevice,
                classes: vec!["write".to_owned()],
                limit: 2,
                period_s: 60,
                burst: None,
                when: palisade::config::When::Always,
                shadow: false,
            });
    })
    .await
    .unwrap();
    let write = |ip: &str, device: Option<&str>| {
        let mut body = json!({"endpoint": "/profile", "method": "POST", "ip": ip});
        if let Some(device) = device {
            body["device_id"] = json!(device);
        }
        body
    };
    for _ in 0..2 {
        let (status, _) = status_of(&app, &write("192.0.2.1", Some("tab"))).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (status, body) = status_of(&app, &write("192.0.2.1", Some("tab"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["details"]["budget"], "otp-ipdev");
    assert_eq!(body["error"]["details"]["scope"], "ip_device");
    // The same device elsewhere, and another device here, have their own buckets.
    let (status, body) = status_of(&app, &write("192.0.2.2", Some("tab"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = status_of(&app, &write("192.0.2.1", Some("phone"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A request without a device id is not counted by it.
    for _ in 0..5 {
        let (status, body) = status_of(&app, &write("192.0.2.1", None)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

async fn spraying_from_a_shared_address_needs_more_evidence(app: TestApp) {
    let failures = |ip: &str, n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| {
                json!({"event_id": format!("bad-{ip}-{i}"), "type": "login_failure",
                       "account": format!("victim{i}"), "ip": ip})
            })
            .collect()
    };
    // A plain address failing on 25 accounts is spraying: auth multiplier 0.
    app.post_auth(failures("192.0.2.50", 25)).await;
    assert_eq!(auth_multiplier(&app, "192.0.2.50").await, 0.0);
    // A shared one (carrier NAT) is not, at 25 (its threshold is 5 × 20).
    successes(&app, NAT, 20).await;
    app.post_auth(failures(NAT, 25)).await;
    assert_eq!(auth_multiplier(&app, NAT).await, 1.0);
    // At 100 it is.
    let more: Vec<Value> = (25..100)
        .map(|i| {
            json!({"event_id": format!("bad-{NAT}-{i}"), "type": "login_failure",
                   "account": format!("victim{i}"), "ip": NAT})
        })
        .collect();
    app.post_auth(more).await;
    assert_eq!(auth_multiplier(&app, NAT).await, 0.0);
}

async fn auth_multiplier(app: &TestApp, ip: &str) -> f64 {
    let view = app
        .admin_json(&format!(
            "/v1/multipliers?ip={ip}&endpoint=/auth/login&method=POST"
        ))
        .await;
    view["keys"][&format!("ip:{ip}")]["multiplier"]
        .as_f64()
        .unwrap_or_else(|| panic!("{view}"))
}

async fn refusals_carry_a_stable_reason_code(app: TestApp) {
    for _ in 0..5 {
        app.limit_check(&login("rita", "203.0.113.9", None)).await;
    }
    let response = app.limit_check(&login("rita", "203.0.113.9", None)).await;
    let body = assert_envelope(response, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(body["error"]["details"]["reason"], "account_rate");

    // A locked account.
    let events: Vec<Value> = (0..10)
        .map(|i| {
            json!({"event_id": format!("lock-{i}"), "type": "login_failure",
                   "account": "lena", "ip": format!("192.0.2.{}", 100 + i)})
        })
        .collect();
    app.post_auth(events).await;
    let response = app.limit_check(&login("lena", "203.0.113.10", None)).await;
    let body = assert_envelope(response, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(body["error"]["details"]["reason"], "account_locked");
}

/// `per_source` failures on distinct accounts from each address of `sources`.
async fn spray(app: &TestApp, sources: &[String], per_source: usize) {
    let mut events = Vec::new();
    for (n, ip) in sources.iter().enumerate() {
        for i in 0..per_source {
            events.push(
                json!({"event_id": format!("spray-{n}-{i}"), "type": "login_failure",
                               "account": format!("target{n}-{i}"), "ip": ip}),
            );
        }
    }
    app.post_auth(events).await;
}

fn fresh_login(ip: &str) -> Value {
    login(&format!("someone-new-{ip}"), ip, None)
}

async fn spraying_from_rotating_addresses_of_one_slash_24_blocks_the_network(app: TestApp) {
    // A customer who logged in from the network before the attack.
    app.post_auth(vec![json!({"event_id": "home-ok", "type": "login_success",
                               "account": "homeowner", "ip": "203.0.113.150"})])
        .await;
    // 19 accounts from each of 5 addresses: no address reaches 20.
    let sources: Vec<String> = (1..=5).map(|i| format!("203.0.113.{i}")).collect();
    spray(&app, &sources, 19).await;
    for ip in &sources {
        assert_eq!(
            auth_multiplier(&app, ip).await,
            1.0,
            "{ip} alone is under 20"
        );
    }
    // A login on auth from an address of the /24 it has not used yet, on an account that
    // does not know it, passes only with a login challenge…
    assert_eq!(
        stopped(&app, &fresh_login("203.0.113.200"))
            .await
            .as_deref(),
        Some("network_blocked")
    );
    // …and a request naming no account is refused.
    let anonymous = json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.201"});
    let (status, body) = status_of(&app, &anonymous).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["details"]["reason"], "ip_blocked");
    // The customer who knows the network gets through, asked for a step-up.
    let (status, body) = status_of(&app, &login("homeowner", "203.0.113.151", None)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["challenge"]["code"], "known_context", "{body}");
    assert!(body["challenge"].get("lockout_id").is_none(), "{body}");
    // …but not elsewhere, nor on other classes.
    let (status, _) = status_of(&app, &fresh_login("203.0.114.200")).await;
    assert_eq!(status, StatusCode::OK);
    let read = json!({"endpoint": "/feed", "method": "GET", "ip": "203.0.113.200"});
    assert_eq!(app.limit_check(&read).await.status(), StatusCode::OK);
    // One alert names the network.
    let alerts = app.admin_json("/v1/alerts?kind=spraying").await;
    let text = alerts.to_string();
    assert!(text.contains("ip:203.0.113.0/24"), "{text}");
}

async fn spraying_from_rotating_slash_64s_of_one_slash_48_blocks_the_network(app: TestApp) {
    let sources: Vec<String> = (1..=3).map(|i| format!("2001:db8:7:{i}::1")).collect();
    spray(&app, &sources, 19).await;
    assert_eq!(
        stopped(&app, &fresh_login("2001:db8:7:ff::9"))
            .await
            .as_deref(),
        Some("network_blocked")
    );
    assert_eq!(stopped(&app, &fresh_login("2001:db8:8:1::9")).await, None);
}

async fn spraying_from_rotating_networks_of_one_asn_blocks_the_asn(app: TestApp) {
    app.load_data(&[(
        "tests/fixtures/mmdb/GeoLite2-ASN-Test.mmdb",
        "asn/GeoLite2-ASN-Test.mmdb",
    )])
    .await;
    // Three /24s of AS1221, 19 accounts each: no address or /24 reaches its threshold.
    let sources: Vec<String> = (1..=3).map(|i| format!("1.128.{i}.1")).collect();
    spray(&app, &sources, 19).await;
    assert_eq!(
        stopped(&app, &fresh_login("1.129.0.1")).await.as_deref(),
        Some("network_blocked")
    );
    assert_eq!(stopped(&app, &fresh_login("203.0.113.1")).await, None);
}

/// Spraying spread thin: six accounts fail from six networks of one ASN, one each. The
/// ASN is suspected: a login there from a context its account does not know gets a login
/// challenge; its own users, and requests naming no account, pass as before.
async fn a_few_accounts_failing_across_an_asn_make_it_suspected(app: TestApp) {
    app.load_data(&[(
        "tests/fixtures/mmdb/GeoLite2-ASN-Test.mmdb",
        "asn/GeoLite2-ASN-Test.mmdb",
    )])
    .await;
    app.post_auth(vec![
        json!({"event_id": "resident", "type": "login_success",
                               "account": "resident", "ip": "1.140.0.9"}),
    ])
    .await;
    let failing: Vec<Value> = (1..=5)
        .map(|i| {
            json!({"event_id": format!("thin-{i}"), "type": "login_failure",
                   "account": format!("thin{i}"), "ip": format!("1.{}.0.7", 130 + i)})
        })
        .collect();
    app.post_auth(failing).await;
    assert_eq!(
        stopped(&app, &fresh_login("1.145.0.1")).await,
        None,
        "five accounts, one success: not yet"
    );
    app.post_auth(vec![
        json!({"event_id": "thin-6", "type": "login_failure",
                               "account": "thin6", "ip": "1.136.0.7"}),
        json!({"event_id": "thin-7", "type": "login_failure",
                               "account": "thin7", "ip": "1.137.0.7"}),
    ])
    .await;
    assert_eq!(
        stopped(&app, &fresh_login("1.145.0.2")).await.as_deref(),
        Some("network_spraying")
    );
    let status = app.status("someone-new", "1.145.0.3", None).await;
    assert_eq!(status["action"], "challenge", "{status}");
    // Its own user passes freely, from a network it knows.
    assert_eq!(
        stopped(&app, &login("resident", "1.140.0.10", None)).await,
        None
    );
    let status = app.status("resident", "1.140.0.10", None).await;
    assert_eq!(status["action"], "none", "{status}");
    // A request naming no account is not refused, nor a login from elsewhere.
    let anonymous = json!({"endpoint": "/auth/login", "method": "POST", "ip": "1.145.0.4"});
    assert_eq!(app.limit_check(&anonymous).await.status(), StatusCode::OK);
    assert_eq!(stopped(&app, &fresh_login("203.0.113.77")).await, None);
}

async fn a_busy_carrier_network_with_more_successes_is_not_spraying(app: TestApp) {
    // 60 accounts log in from the /24 (many addresses), then 45 fail (typos).
    let events: Vec<Value> = (0..60)
        .map(|i| {
            json!({"event_id": format!("ok-{i}"), "type": "login_success",
                   "account": format!("customer{i}"), "ip": format!("198.51.100.{}", i + 1)})
        })
        .collect();
    app.post_auth(events).await;
    let sources: Vec<String> = (1..=5).map(|i| format!("198.51.100.{i}")).collect();
    spray(&app, &sources, 9).await;
    let (status, body) = status_of(&app, &fresh_login("198.51.100.200")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Failed logins on distinct accounts, each from an address of its own /24 (no address,
/// network or ASN sees more than one), numbered from `from`.
fn stuffing(from: usize, n: usize) -> Vec<Value> {
    (from..from + n)
        .map(|i| {
            json!({"event_id": format!("stuff-{i}"), "type": "login_failure",
                   "account": format!("leaked{i}"),
                   "ip": format!("{}.{}.{}.9", 20 + i % 150, i / 150, i % 7)})
        })
        .collect()
}

async fn stuffing_spread_over_many_networks_turns_the_login_guard_on(app: TestApp) {
    // 100 accounts log in from home; 60 logins fail elsewhere: a failure share of 0.375.
    members_at_home(&app).await;
    app.post_auth(stuffing(0, 60)).await;
    let (status, body) = status_of(&app, &fresh_login("192.0.2.80")).await;
    assert_eq!(status, StatusCode::OK, "a minority of failures: {body}");
    // 120 more (180 of 280 logins failed): the guard turns on.
    app.post_auth(stuffing(60, 120)).await;
    assert_eq!(
        stopped(&app, &fresh_login("192.0.2.81")).await.as_deref(),
        Some("login_guard")
    );
    let view = app.admin_json("/v1/login-guard").await;
    assert_eq!(view["active"], true, "{view}");
    assert_eq!(view["successes"], 100, "{view}");
    // 180 failures and the challenged login just now.
    assert_eq!(view["failures"], 181, "{view}");
    assert!(view["active_until"].is_string(), "{view}");
    // A member logging in from its home network passes, asked for a step-up.
    let (status, body) = status_of(&app, &login("member3", "198.18.0.200", None)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["challenge"]["code"], "known_context", "{body}");
    // A member from a network it never used is a stranger now: a login challenge.
    assert_eq!(
        stopped(&app, &login("member3", "192.0.2.82", None))
            .await
            .as_deref(),
        Some("login_guard")
    );
    // A member whose account a stranger locked meanwhile: from home, every decision point
    // gives the owner the same step-up, not the lock's 429.
    let lock: Vec<Value> = (0..10)
        .map(|i| {
            json!({"event_id": format!("lock-{i}"), "type": "login_failure",
                        "account": "member4", "ip": format!("203.0.113.{}", 100 + i)})
        })
        .collect();
    app.post_auth(lock).await;
    let status_view = app
        .admin_json("/v1/accounts/member4/status?ip=198.18.0.201")
        .await;
    assert_eq!(status_view["action"], "challenge", "{status_view}");
    let (status, body) = status_of(&app, &login("member4", "198.18.0.201", None)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the owner at home, guard on and locked: {body}"
    );
    assert_eq!(body["challenge"]["code"], "known_context", "{body}");
    let through_gateway = app
        .client
        .get(app.url("/v1/forward-auth"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .header("x-forwarded-method", "POST")
        .header("x-forwarded-uri", "/auth/login")
        .header("x-forwarded-for", "198.18.0.201")
        .header("x-user-id", "member4")
        .send()
        .await
        .unwrap();
    assert_eq!(through_gateway.status(), StatusCode::OK);
    assert_eq!(
        through_gateway.headers()["x-palisade-challenge"],
        "known_context"
    );
    // A stranger on the locked account is still refused.
    let (status, _) = status_of(&app, &login("member4", "192.0.2.87", None)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Other classes, and auth requests naming no account, are not guarded.
    let read = json!({"endpoint": "/feed", "method": "GET", "ip": "192.0.2.83", "user_id": "x"});
    assert_eq!(app.limit_check(&read).await.status(), StatusCode::OK);
    let anonymous = json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.84"});
    assert_eq!(app.limit_check(&anonymous).await.status(), StatusCode::OK);
    // The guard stays on for its hold (15 min), then lapses once nothing feeds it (on the
    // manual clock only: real time would take the quarter hour).
    if app.backend == crate::helpers::Backend::Embedded {
        app.advance(std::time::Duration::from_secs(14 * 60)).await;
        assert_eq!(
            stopped(&app, &fresh_login("192.0.2.85")).await.as_deref(),
            Some("login_guard")
        );
        app.advance(std::time::Duration::from_secs(2 * 60)).await;
        assert_eq!(stopped(&app, &fresh_login("192.0.2.86")).await, None);
        let view = app.admin_json("/v1/login-guard").await;
        assert_eq!(view["active"], false, "{view}");
        assert!(view.get("active_until").is_none(), "{view}");
    }
}

/// The guard on: 100 members logged in from home, then 180 logins failed elsewhere.
async fn turn_the_guard_on(app: &TestApp) {
    members_at_home(app).await;
    app.post_auth(stuffing(0, 180)).await;
}

/// 100 members log in from home (`member{i}` from `198.18.{i / 50}.{i % 50 + 1}`).
async fn members_at_home(app: &TestApp) {
    let homes: Vec<Value> = (0..100)
        .map(|i| {
            json!({"event_id": format!("home-{i}"), "type": "login_success",
                   "account": format!("member{i}"), "ip": format!("198.18.{}.{}", i / 50, i % 50 + 1)})
        })
        .collect();
    app.post_auth(homes).await;
}

fn challenge_passed(id: &str, account: &str, ip: &str, challenge: Option<&str>) -> Value {
    let mut event = json!({"event_id": id, "type": "challenge_passed", "account": account,
                           "ip": ip, "device_id": "new-phone"});
    if let Some(challenge) = challenge {
        event["challenge_id"] = json!(challenge);
    }
    event
}

async fn a_first_sign_in_under_the_guard_is_challenged_and_passing_makes_it_known(app: TestApp) {
    turn_the_guard_on(&app).await;
    let failures = app.admin_json("/v1/login-guard").await["failures"].clone();
    // A member on a new phone from a new network: a step-up, not a 429.
    let first = login("member7", "192.0.2.120", Some("new-phone"));
    let (status, body) = status_of(&app, &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["challenge"]["code"], "login_guard", "{body}");
    let id = body["challenge"]["id"].as_str().unwrap().to_owned();
    // The auth service's status says the same.
    let status = app
        .status("member7", "192.0.2.120", Some("new-phone"))
        .await;
    assert_eq!(status["action"], "challenge", "{status}");
    assert!(status.to_string().contains("login_guard"), "{status}");
    // The unsolved challenge counts for the guard as a refusal did.
    let view = app.admin_json("/v1/login-guard").await;
    assert_eq!(
        view["failures"].as_u64(),
        failures.as_u64().map(|f| f + 1),
        "{view}"
    );
    // Through the gateway the app and the auth service get the same, the id as a header.
    let gateway = app
        .client
        .get(app.url("/v1/forward-auth"))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .header("x-forwarded-method", "POST")
        .header("x-forwarded-uri", "/auth/login")
        .header("x-forwarded-for", "192.0.2.121")
        .header("x-user-id", "member8")
        .send()
        .await
        .unwrap();
    assert_eq!(gateway.status(), StatusCode::OK);
    assert_eq!(gateway.headers()["x-palisade-challenge"], "login_guard");
    assert!(gateway.headers().contains_key("x-palisade-challenge-id"));
    // Envoy: allowed, the challenge to the client and to the upstream auth service.
    let mut envoy = crate::gateways::Envoy::start(&app).await;
    let answer = envoy
        .call(
            Some(crate::helpers::ADMIN_TOKEN),
            palisade::api::envoy::proto::RateLimitRequest {
                domain: "edge".to_owned(),
                descriptors: vec![
                    crate::gateways::descriptor(&[("remote_address", "192.0.2.122")]),
                    crate::gateways::descriptor(&[("user_id", "member9")]),
                    crate::gateways::descriptor(&[("path", "/auth/login"), ("method", "POST")]),
                ],
                hits_addend: 0,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        answer.overall_code,
        palisade::api::envoy::proto::Code::Ok as i32
    );
    for headers in [
        &answer.response_headers_to_add,
        &answer.request_headers_to_add,
    ] {
        let named = |name: &str| {
            headers
                .iter()
                .find(|h| h.key == name)
                .map(|h| h.value.clone())
        };
        assert_eq!(
            named("x-palisade-challenge").as_deref(),
            Some("login_guard")
        );
        assert!(named("x-palisade-challenge-id").is_some(), "{headers:?}");
    }
    // A challenge reported without its id, with another account's, or one never issued:
    // 400 with the event's index, nothing stored.
    for (event, why) in [
        (
            challenge_passed("cp-0", "member7", "192.0.2.120", None),
            "no id",
        ),
        (
            challenge_passed("cp-0", "member9", "192.0.2.120", Some(&id)),
            "another account",
        ),
        (
            challenge_passed(
                "cp-0",
                "member7",
                "192.0.2.120",
                Some("01JUNKJUNKJUNKJUNKJUNKJUNK"),
            ),
            "never issued",
        ),
        (
            json!({"event_id": "cp-0", "type": "login_success", "account": "member7",
                   "ip": "192.0.2.120", "challenge_id": id}),
            "an id on a login",
        ),
    ] {
        let response = app
            .post(
                "/v1/events/auth",
                Some(crate::helpers::ADMIN_TOKEN),
                &json!({ "events": [event] }),
            )
            .await;
        let body = assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        assert_eq!(
            body["error"]["details"]["errors"][0]["index"], 0,
            "{why}: {body}"
        );
    }
    // Passed: the context is known to the account, and the next login from it is the
    // known context's (a step-up at worst while the guard is on).
    let accepted = app
        .post_auth(vec![challenge_passed(
            "cp-1",
            "member7",
            "192.0.2.120",
            Some(&id),
        )])
        .await;
    assert_eq!(accepted["accepted"], 1, "{accepted}");
    // Reported twice (a retried batch): the same answer.
    app.post_auth(vec![challenge_passed(
        "cp-1",
        "member7",
        "192.0.2.120",
        Some(&id),
    )])
    .await;
    assert_eq!(
        stopped(&app, &first).await.as_deref(),
        Some("known_context")
    );
    let status = app
        .status("member7", "192.0.2.120", Some("new-phone"))
        .await;
    assert_eq!(status["action"], "challenge", "{status}");
    assert!(status.to_string().contains("known_context"), "{status}");
    // The same phone on another network is known too (the device), a stranger's is not.
    assert_eq!(
        stopped(&app, &login("member7", "203.0.113.9", Some("new-phone")))
            .await
            .as_deref(),
        Some("known_context")
    );
    assert_eq!(
        stopped(&app, &login("member7", "203.0.113.10", Some("other-phone")))
            .await
            .as_deref(),
        Some("login_guard")
    );
    // A passed challenge is not a login: the guard's successes did not move.
    let view = app.admin_json("/v1/login-guard").await;
    assert_eq!(view["successes"], 100, "{view}");
    // The analyst sees it on the account's timeline.
    let events = app
        .admin_json("/v1/events/auth?account=member7&type=challenge_passed")
        .await;
    assert!(events.to_string().contains("cp-1"), "{events}");
}

async fn unknown_contexts_are_refused_when_the_policy_says_refuse(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, |s| {
        s.lockout.unknown_context = palisade::config::UnknownContext::Refuse;
    })
    .await
    .unwrap();
    turn_the_guard_on(&app).await;
    assert_eq!(
        stopped(&app, &login("member7", "192.0.2.120", Some("new-phone")))
            .await
            .as_deref(),
        Some("login_guard")
    );
    let (status, _) = status_of(&app, &login("member7", "192.0.2.120", None)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let status = app.status("member7", "192.0.2.120", None).await;
    assert_eq!(status["action"], "lockout", "{status}");
    // A known context still passes with a step-up.
    assert_eq!(
        stopped(&app, &login("member7", "198.18.0.200", None))
            .await
            .as_deref(),
        Some("known_context")
    );
}

/// A stolen device id tried on one account after another from one address: once its
/// budget refuses most attempts, the accounts it is refused on count with those it failed
/// on, and it is blocked without waiting for a trickle of failures. An office whose new
/// sign-ins wait for its address's budget, with few failures, is not.
async fn accounts_a_budget_refused_count_as_spraying_evidence(app: TestApp) {
    let backend = app.backend;
    drop(app);
    // No L1 cache of refusals: every refused check reaches the rule (with it, at most one
    // check per bucket and 250 ms is counted).
    let app = TestApp::spawn_with(backend, |s| s.limits.l1_ttl_ms = 0)
        .await
        .unwrap();
    let thief = "192.0.2.66";
    let failures: Vec<Value> = (0..10)
        .map(|i| {
            json!({"event_id": format!("stolen-{i}"), "type": "login_failure",
                   "account": format!("tried{i}"), "ip": thief, "device_id": "phone0"})
        })
        .collect();
    app.post_auth(failures).await;
    assert_eq!(
        auth_multiplier(&app, thief).await,
        1.0,
        "10 accounts failed"
    );
    // Its budget lets 10 through, then refuses 10 more accounts: 20 accounts tried.
    let mut refused = 0;
    for i in 10..30 {
        let (status, _) =
            status_of(&app, &login(&format!("tried{i}"), thief, Some("phone0"))).await;
        refused += u32::from(status == StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(refused, 10);
    // Blocked (on Redis, published to every instance within a second).
    let mut multiplier = 1.0;
    for _ in 0..30 {
        multiplier = auth_multiplier(&app, thief).await;
        if multiplier == 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(multiplier, 0.0, "blocked as spraying");
    let (status, body) = status_of(&app, &login("tried99", thief, Some("phone0"))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let reason = &body["error"]["details"]["reason"];
    assert!(
        reason == "ip_blocked" || reason == "device_blocked",
        "{body}"
    );
    // The office: 2 typos, then 30 new sign-ins of which the budget lets 10 through.
    let office = "198.51.100.200";
    app.post_auth(vec![
        json!({"event_id": "typo-0", "type": "login_failure", "account": "clerk0", "ip": office}),
        json!({"event_id": "typo-1", "type": "login_failure", "account": "clerk1", "ip": office}),
    ])
    .await;
    for i in 0..30 {
        status_of(&app, &login(&format!("clerk{i}"), office, None)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    assert_eq!(
        auth_multiplier(&app, office).await,
        1.0,
        "an office is not spraying"
    );
}

/// Every user logs in again at once (an app update signed them out; a password-reset
/// campaign): as many failures as successes, all from their own phones and networks. The
/// guard judges failures from unknown contexts only, and stays off.
async fn a_forced_re_login_of_every_user_leaves_the_guard_off(app: TestApp) {
    let home = |i: usize| format!("198.18.{}.{}", i / 200, i % 200 + 1);
    let before: Vec<Value> = (0..400)
        .map(|i| {
            json!({"event_id": format!("before-{i}"), "type": "login_success",
                   "account": format!("member{i}"), "ip": home(i), "device_id": format!("phone{i}"), "ts": palisade::clock::rfc3339(app.app.clock.now_ms() - 3_600_000)})
        })
        .collect();
    app.post_auth(before).await;
    // Now: each fails once with the old password, then gets in (a third from another address
    // of its home network, on its own phone).
    let mut again = Vec::new();
    for i in 0..400 {
        let ip = if i % 3 == 0 {
            format!("198.18.{}.250", i / 200)
        } else {
            home(i)
        };
        for (n, kind) in ["login_failure", "login_success"].into_iter().enumerate() {
            again.push(json!({"event_id": format!("again-{i}-{n}"), "type": kind,
                              "account": format!("member{i}"), "ip": ip, "device_id": format!("phone{i}")}));
        }
    }
    for batch in again.chunks(200) {
        app.post_auth(batch.to_vec()).await;
    }
    let view = app.admin_json("/v1/login-guard").await;
    assert_eq!(view["active"], false, "{view}");
    assert_eq!(view["failures"], 400, "{view}");
    assert_eq!(view["unknown_failures"], 0, "{view}");
    assert_eq!(view["threshold"], 100, "{view}");
    assert_eq!(
        stopped(&app, &fresh_login("192.0.2.130")).await,
        None,
        "nobody is challenged"
    );
}

async fn a_network_block_is_renewed_while_its_spraying_goes_on(app: TestApp) {
    // Blocks of 4 s, and no login guard (the refusals below would turn it on).
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, |s| {
        s.lockout.spray_block_s = 4;
        s.lockout.stuffing.min_failures = 0;
    })
    .await
    .unwrap();
    let sources: Vec<String> = (1..=5).map(|i| format!("203.0.113.{i}")).collect();
    spray(&app, &sources, 19).await;
    let blocked = Some("network_blocked");
    assert_eq!(
        stopped(&app, &fresh_login("203.0.113.200"))
            .await
            .as_deref(),
        blocked
    );
    // In the block's second half, 40 accounts are tried from new addresses of the /24
    // (challenged, never passed).
    app.advance(std::time::Duration::from_millis(2_500)).await;
    for i in 0..40 {
        let ip = format!("203.0.113.{}", 100 + i);
        assert_eq!(stopped(&app, &fresh_login(&ip)).await.as_deref(), blocked);
    }
    // Past the first block's end it still holds…
    app.advance(std::time::Duration::from_millis(2_500)).await;
    assert_eq!(
        stopped(&app, &fresh_login("203.0.113.201"))
            .await
            .as_deref(),
        blocked
    );
    let view = app.admin_json("/v1/login-guard").await;
    assert_eq!(view["active"], false, "{view}");
    assert_eq!(
        view["blocked_networks"][0]["key"], "ip:203.0.113.0/24",
        "{view}"
    );
    // …and lapses when the attempts stop.
    app.advance(std::time::Duration::from_millis(4_500)).await;
    assert_eq!(stopped(&app, &fresh_login("203.0.113.202")).await, None);
}

/// Marks made on one instance are enforced by every instance within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn shared_addresses_and_network_blocks_reach_every_instance() {
    let Some(first) = TestApp::spawn(crate::helpers::Backend::Production).await else {
        return;
    };
    let second = first.another_instance().await;
    successes(&first, NAT, 20).await;
    let sources: Vec<String> = (1..=5).map(|i| format!("203.0.113.{i}")).collect();
    spray(&first, &sources, 19).await;
    // The background task reads them back each second; one step of it here.
    second.app.scoring.shared_ips().refresh().await.unwrap();
    second.app.scoring.network_blocks().refresh().await.unwrap();
    assert_eq!(
        stopped(&second, &fresh_login("203.0.113.200"))
            .await
            .as_deref(),
        Some("network_blocked")
    );
    for device in 0..15 {
        let (status, body) = status_of(
            &second,
            &login(&format!("n{device}"), NAT, Some(&format!("q{device}"))),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{device}: {body}");
    }
}

/// The login guard judges every instance's logins: each adds its counts to Redis and reads
/// the sums back each second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn the_login_guard_counts_every_instances_logins() {
    let Some(first) = TestApp::spawn(crate::helpers::Backend::Production).await else {
        return;
    };
    let second = first.another_instance().await;
    // 60 failures each: under 100 on either instance alone.
    first.post_auth(stuffing(0, 60)).await;
    second.post_auth(stuffing(60, 60)).await;
    let (status, body) = status_of(&first, &fresh_login("192.0.2.90")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // One step of the background task on each (the second reads both counts).
    first.app.scoring.login_guard().flush().await.unwrap();
    second.app.scoring.login_guard().flush().await.unwrap();
    first.app.scoring.login_guard().flush().await.unwrap();
    for app in [&first, &second] {
        assert_eq!(
            stopped(app, &fresh_login("192.0.2.91")).await.as_deref(),
            Some("login_guard")
        );
    }
}

/// On a Redis Cluster the guard's counts share one hash slot: a flush is one pipeline there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn the_login_guard_shares_its_counts_on_a_redis_cluster() {
    let Some((_cluster, app)) = TestApp::on_cluster().await else {
        return;
    };
    app.post_auth(stuffing(0, 120)).await;
    let guard = app.app.scoring.login_guard();
    guard
        .flush()
        .await
        .expect("one pipeline on one cluster node");
    assert!(guard.is_active());
    assert_eq!(guard.state().failures, 120);
    assert_eq!(
        stopped(&app, &fresh_login("192.0.2.95")).await.as_deref(),
        Some("login_guard")
    );
}

/// A production instance whose credential-stuffing window is one second (None where the
/// services are missing locally).
async fn one_second_window() -> Option<TestApp> {
    TestApp::spawn_with(crate::helpers::Backend::Production, |s| {
        s.lockout.stuffing.window_s = 1;
    })
    .await
}

/// An instance that starts while the guard holds (its window's counts already gone) learns
/// the guard's end from the others at its first flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn an_instance_started_during_the_guards_hold_enforces_it() {
    // A one-second window: the counts are gone long before the 15 min hold ends.
    let Some(first) = one_second_window().await else {
        return;
    };
    first.post_auth(stuffing(0, 120)).await;
    first.app.scoring.login_guard().flush().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let second = first.another_instance().await;
    let guard = second.app.scoring.login_guard();
    guard.flush().await.unwrap();
    assert_eq!(guard.state().failures, 0, "the window has moved on");
    assert!(guard.is_active());
    assert_eq!(
        stopped(&second, &fresh_login("192.0.2.96"))
            .await
            .as_deref(),
        Some("login_guard")
    );
}

/// What one instance learned of the service's normal is kept in Redis: an instance that
/// starts later judges with it at once instead of learning three windows again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn an_instance_started_later_takes_the_learned_normal() {
    let Some(first) = one_second_window().await else {
        return;
    };
    let guard = first.app.scoring.login_guard();
    // Five quiet windows of a few failures each: the normal is learned from three.
    for window in 0..5 {
        first.post_auth(stuffing(window * 4, 4)).await;
        guard.flush().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1_050)).await;
    }
    guard.flush().await.unwrap();
    let learned = guard.state();
    assert!(learned.learned, "{learned:?}");
    let second = first.another_instance().await;
    let newcomer = second.app.scoring.login_guard();
    assert!(
        !newcomer.state().learned,
        "nothing learned before its first flush"
    );
    newcomer.flush().await.unwrap();
    let taken = newcomer.state();
    assert!(taken.learned, "{taken:?}");
    // The learned normal, or, when the newcomer took longer than a window to start (a busy
    // machine), what the quiet windows since made of it: each moves it a fifth of the way to
    // their 0 failures, as it would on the first instance.
    let (learned, taken) = (learned.normal.unwrap(), taken.normal.unwrap());
    assert!(
        (0..4).any(|quiet| (taken - learned * 0.8f64.powi(quiet)).abs() < 1e-9),
        "took {taken}, learned {learned}"
    );
}

/// A release on one instance ends every instance's hold: when it runs out, the guard stays
/// off until new failures turn it on (no instance brings back the hold it had judged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_release_ends_the_guard_on_every_instance_for_good() {
    // A one-second window: the failures are gone when the release runs out.
    let Some(first) = one_second_window().await else {
        return;
    };
    let second = first.another_instance().await;
    first.post_auth(stuffing(0, 60)).await;
    second.post_auth(stuffing(60, 60)).await;
    let (a, b) = (
        first.app.scoring.login_guard(),
        second.app.scoring.login_guard(),
    );
    a.flush().await.unwrap();
    b.flush().await.unwrap();
    a.flush().await.unwrap();
    assert!(
        a.is_active() && b.is_active(),
        "on everywhere (15 min hold)"
    );
    a.release(first.app.clock.now_ms() + 1_500).await.unwrap();
    b.flush().await.unwrap();
    assert!(!a.is_active() && !b.is_active(), "off everywhere");
    tokio::time::sleep(std::time::Duration::from_millis(1_700)).await;
    for _ in 0..2 {
        b.flush().await.unwrap();
        a.flush().await.unwrap();
    }
    assert!(
        !a.is_active() && !b.is_active(),
        "the release ran out and no failures came since: the guard stays off"
    );
    assert_eq!(stopped(&second, &fresh_login("192.0.2.99")).await, None);
}

/// An analyst releases the guard (the failures were an auth service's bug, not an attack):
/// off at once, kept off while more failures arrive, audited; a reason is required.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn an_analyst_releases_the_login_guard() {
    for backend in [
        crate::helpers::Backend::Embedded,
        crate::helpers::Backend::Production,
    ] {
        let Some(app) = TestApp::spawn(backend).await else {
            continue;
        };
        app.post_auth(stuffing(0, 120)).await;
        assert_eq!(
            stopped(&app, &fresh_login("192.0.2.97")).await.as_deref(),
            Some("login_guard"),
            "{backend:?}"
        );
        let analyst = app.create_token("analyst", "ana").await.1;
        let missing = app
            .post(
                "/v1/login-guard/release",
                Some(&analyst),
                &json!({"for_s": 600}),
            )
            .await;
        assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
        let too_long = app
            .post(
                "/v1/login-guard/release",
                Some(&analyst),
                &json!({"reason": "x", "for_s": 100_000}),
            )
            .await;
        assert_envelope(too_long, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        let response = app
            .post(
                "/v1/login-guard/release",
                Some(&analyst),
                &json!({"reason": "auth service reported every login as failed", "for_s": 600}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        let view: Value = response.json().await.unwrap();
        assert_eq!(view["active"], false, "{view}");
        assert!(view["released_until"].is_string(), "{view}");
        app.post_auth(stuffing(120, 120)).await;
        app.app.scoring.login_guard().flush().await.unwrap();
        assert_eq!(
            stopped(&app, &fresh_login("192.0.2.98")).await,
            None,
            "{backend:?}"
        );
        let audit = app.admin_json("/v1/audit?action=login_guard.release").await;
        assert!(
            audit
                .to_string()
                .contains("auth service reported every login as failed"),
            "{audit}"
        );
    }
}
