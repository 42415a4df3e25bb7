//! The analyst console: served with a strict content policy, and walked by an analyst in a
//! real headless Chromium (`tests/console/walk.py`, Playwright for Python driving Debian's
//! `chromium`): sign in, read the login guard and the charts, find the accounts a scripted
//! attack locked, read why, release one where it is shown and the rest in bulk, see the audit
//! entry; then an unreachable API, a refused search and a phone.

use std::path::PathBuf;
use std::process::Command;

use reqwest::StatusCode;

use crate::helpers::{Backend, TestApp};
use crate::on_both_backends;

on_both_backends!(an_admin_reads_suggested_budgets_and_runs_them_as_a_canary_in_a_real_browser);

/// Chromium and Playwright, or None (a loud skip locally; a failure in CI).
fn browser() -> Option<PathBuf> {
    let chromium = PathBuf::from("/usr/bin/chromium");
    let playwright = Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .status()
        .is_ok_and(|s| s.success());
    if chromium.is_file() && playwright {
        return Some(chromium);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "CI=true but chromium or Playwright for Python is missing (.ci/run installs both)"
    );
    eprintln!(
        "SKIPPED (no browser): apt-get install chromium && pip install playwright (no browser download needed)"
    );
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_a_strict_policy() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/budgets.js", "text/javascript"),
        ("/console/app.css", "text/css"),
    ] {
        let response = app.get(path, None).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind));
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"));
        assert!(policy.contains("frame-ancestors 'none'"));
        assert_eq!(headers["x-content-type-options"], "nosniff");
    }
    let page = app.get("/console", None).await.text().await.unwrap();
    // No external origin: everything comes from this binary.
    assert!(!page.contains("http://") && !page.contains("https://"));
    let mut script = app.get("/console/app.js", None).await.text().await.unwrap();
    script.push_str(
        &app.get("/console/budgets.js", None)
            .await
            .text()
            .await
            .unwrap(),
    );
    assert!(
        !script.contains("innerHTML"),
        "API data goes into the page as text only"
    );
    assert!(
        !script.contains("localStorage.setItem"),
        "the token stays in session storage"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_analyst_finds_reads_and_releases_in_a_real_browser() {
    let Some(chromium) = browser() else {
        return;
    };
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    // A scripted attack: three accounts guessed from one address, one from another, and an
    // account whose name is markup.
    // victim-2's batch holds three failures past the tenth: its lockout lists them apart.
    for (account, failures) in [("victim-1", 10), ("victim-2", 13), ("victim-3", 10)] {
        app.fail(
            &format!("w-{account}"),
            account,
            &["198.51.100.7"],
            failures,
        )
        .await;
    }
    app.fail("w-other", "other-user", &["203.0.113.9"], 10)
        .await;
    app.fail(
        "w-markup",
        "<img src=x onerror=window.pwned=1>",
        &["192.0.2.200"],
        10,
    )
    .await;
    // An override and a canary for the policy view.
    let until = chrono::DateTime::from_timestamp_millis(app.app.clock.now_ms() + 3_600_000)
        .unwrap()
        .to_rfc3339();
    let response = app
        .post(
            "/v1/overrides",
            Some(crate::helpers::ADMIN_TOKEN),
            &serde_json::json!({"account": "partner", "classes": ["read"], "multiplier": 3.0,
                "expires_at": until, "reason": "launch day"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    // An IPv6 household's /64, the subject an IPv6 client is keyed by.
    let response = app
        .post(
            "/v1/overrides",
            Some(crate::helpers::ADMIN_TOKEN),
            &serde_json::json!({"ip": "2001:db8:1::5", "multiplier": 0.5,
                "expires_at": until, "reason": "noisy household"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let response = app
        .post(
            "/v1/policy/candidates",
            Some(crate::helpers::ADMIN_TOKEN),
            &serde_json::json!({"policy": "[limits]\nl1_ttl_ms = 100\n",
                "reason": "try 20 anonymous reads a minute"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let current = app
        .get(
            "/v1/policy/candidates/current",
            Some(crate::helpers::ADMIN_TOKEN),
        )
        .await;
    assert_eq!(
        current.status(),
        StatusCode::OK,
        "{}",
        current.text().await.unwrap()
    );
    // A spraying address (one failure on each of 20 accounts: failing, none locked) and
    // traffic for the block-rate chart, some of it refused.
    let spray: Vec<serde_json::Value> = (0..20)
        .map(|i| {
            crate::lockout::failure(
                &format!("w-spray-{i}"),
                &format!("sprayed-{i}"),
                "203.0.113.66",
            )
        })
        .collect();
    app.post_auth(spray).await;
    for ip in [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "203.0.113.66",
        "203.0.113.66",
    ] {
        app.limit_check(
            &serde_json::json!({"endpoint": "/auth/login", "method": "POST", "ip": ip}),
        )
        .await;
    }
    // The attacker keeps trying victim-1: refusals the decision history explains.
    for _ in 0..2 {
        app.limit_check(
            &serde_json::json!({"endpoint": "/auth/login", "method": "POST",
            "ip": "198.51.100.7", "user_id": "victim-1", "consume": false}),
        )
        .await;
    }
    // SMS pumping to one range: 40 codes sent 20 minutes ago, 1 verified; a code now closes
    // the window and the destination is tightened, with an alert.
    let ago = |ms: i64| palisade::clock::rfc3339(app.app.clock.now_ms() - ms);
    let mut deliveries: Vec<serde_json::Value> = (0..40)
        .map(|i| {
            serde_json::json!({"event_id": format!("w-otp-{i}"), "type": "otp_sent",
                "recipient": format!("+44 7700 9001{i:02}"), "ts": ago(1_200_000 - i)})
        })
        .collect();
    deliveries.push(
        serde_json::json!({"event_id": "w-otp-ok", "type": "otp_verified",
        "recipient": "+44 7700 900100", "ts": ago(1_200_000)}),
    );
    deliveries.push(
        serde_json::json!({"event_id": "w-otp-now", "type": "otp_sent",
        "recipient": "+44 7700 900200", "ts": ago(0)}),
    );
    let response = app
        .post(
            "/v1/events/messaging",
            Some(crate::helpers::ADMIN_TOKEN),
            &serde_json::json!({ "events": deliveries }),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    app.app.history.flush().await.unwrap();
    let (_, token) = app.create_token("analyst", "ana").await;
    walk(&app, "walk.py", vec![token], chromium).await;
}

/// The Budgets view in a real browser: an analyst is told it needs an admin; an admin reads
/// the suggestion from a recorded window (histograms, replay, hold-out) and runs it as a
/// canary with one click (`tests/console/budgets.py`), on both backends.
async fn an_admin_reads_suggested_budgets_and_runs_them_as_a_canary_in_a_real_browser(
    app: TestApp,
) {
    let Some(chromium) = browser() else {
        return;
    };
    let (app, _) = crate::suggest::recorded(app.backend).await;
    // The analyst's first: an admin token of one's own ends the bootstrap token.
    let (_, analyst) = app.create_token("analyst", "ana").await;
    let (_, admin) = app.create_token("admin", "adm").await;
    walk(&app, "budgets.py", vec![admin.clone(), analyst], chromium).await;
    // The canary it loaded is the suggestion, audited with the admin's reason.
    let canary: serde_json::Value = app
        .get("/v1/policy/candidates/current", Some(&admin))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(canary["reason"], "suggested from the last day", "{canary}");
}

/// Runs `tests/console/SCRIPT` against `app` with `args` after its URL (and the screenshot
/// folder of `PALISADE_CONSOLE_SCREENSHOTS`, if set); fails the test with its output.
async fn walk(app: &TestApp, script: &str, args: Vec<String>, chromium: PathBuf) {
    let shots = std::env::var("PALISADE_CONSOLE_SCREENSHOTS").ok();
    let base = app.url("");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/console")
        .join(script);
    let output = tokio::task::spawn_blocking(move || {
        let mut command = Command::new("python3");
        command
            .arg(path)
            .arg(base.trim_end_matches('/'))
            .args(args)
            .env("PALISADE_CHROMIUM", chromium);
        if let Some(dir) = shots {
            command.arg(dir);
        }
        command.output().expect("python3 runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
