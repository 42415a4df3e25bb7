//! Changing policy without fear: the traffic record keeps limit checks with keyed
//! pseudonyms; a replay of it through a candidate `[limits]` predicts exactly what the
//! candidate then does on the same traffic.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp};
use crate::on_both_backends;

on_both_backends!(
    the_record_keeps_checks_with_pseudonyms_only,
    overrides_raise_and_cut_one_subject_everywhere_until_they_end,
    a_canary_counts_what_the_candidate_would_do_and_never_enforces_it,
    a_promoted_canary_is_live_everywhere_until_reverted,
    a_tenant_budget_is_shared_by_its_requests_and_its_override_scales_it,
);

const KEY: &str = "replay-test-pseudonym-key-0123456789abcdef";

/// A candidate: anonymous clients get a third of today's budget, readers more, logins fewer,
/// and a partner's app (tenant) a budget of its own.
const CANDIDATE: &str = r#"
[[limits.budgets]]
name = "global"
scope = "global"
limit = 100000
period_s = 1

[[limits.budgets]]
name = "ip-anon"
scope = "ip"
limit = 20
period_s = 60
when = "unauthenticated"

[[limits.budgets]]
name = "user-read"
scope = "user"
classes = ["read"]
limit = 500
period_s = 60

[[limits.budgets]]
name = "auth-account"
scope = "endpoint_user"
classes = ["auth"]
limit = 3
period_s = 60

[[limits.budgets]]
name = "partner"
scope = "tenant"
classes = ["read"]
limit = 10
period_s = 60
"#;

fn recording(s: &mut palisade::Settings) {
    s.privacy.pseudonym_key = Some(palisade::config::Secret::new(KEY));
    s.record.enabled = true;
}

/// The traffic of both runs: anonymous reads, a heavy reader, a login burst, interleaved,
/// 50 ms apart.
fn traffic() -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..120 {
        out.push(json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.10"}));
        for _ in 0..5 {
            out.push(
                json!({"endpoint": format!("/api/items/{i}"), "method": "GET",
                "ip": "192.0.2.11", "user_id": "reader"}),
            );
        }
        if i % 15 == 0 {
            out.push(
                json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.12",
                "user_id": "victim"}),
            );
        }
        // A partner's app: its users on their own addresses, one tenant.
        if i % 4 == 0 {
            out.push(json!({"endpoint": "/api/feed", "method": "GET",
                "ip": format!("192.0.2.{}", 20 + i % 5),
                "user_id": format!("member-{}", i % 5), "tenant": "acme"}));
        }
    }
    out
}

/// Sends the traffic, 50 ms of (manual) time apart; the answers, allowed or not.
async fn run(app: &TestApp, traffic: &[Value]) -> Vec<bool> {
    let mut answers = Vec::with_capacity(traffic.len());
    for check in traffic {
        let response = app.limit_check(check).await;
        let status = response.status();
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{status}"
        );
        answers.push(status == StatusCode::OK);
        app.advance(std::time::Duration::from_millis(50)).await;
    }
    answers
}

async fn recorded(app: &TestApp) -> Vec<palisade::policy::record::Recorded> {
    app.app.recorder.flush().await.unwrap();
    palisade::policy::record::read(&app.app.stores.durable, i64::MIN, i64::MAX, None, 100_000)
        .await
        .unwrap()
}

async fn the_record_keeps_checks_with_pseudonyms_only(app: TestApp) {
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, recording).await.unwrap();
    let traffic: Vec<Value> = traffic().into_iter().take(20).collect();
    for check in &traffic {
        app.limit_check(check).await;
    }
    let rows = recorded(&app).await;
    assert_eq!(rows.len(), traffic.len());
    let text = format!("{rows:?}");
    for clear in ["reader", "victim", "192.0.2.1", "acme", "member-"] {
        assert!(!text.contains(clear), "{clear} is in the record: {text}");
    }
    let reader: Vec<_> = rows
        .iter()
        .filter(|r| r.endpoint.starts_with("/api/items"))
        .collect();
    assert!(
        reader
            .iter()
            .all(|r| r.user == reader[0].user && r.ip == reader[0].ip)
    );
    assert!(reader[0].user.as_deref().unwrap().starts_with("anon-"));
    assert!(reader[0].ip.starts_with("fd"), "{}", reader[0].ip);
    let ordered: Vec<i64> = rows.iter().map(|r| r.at_ms).collect();
    assert!(ordered.windows(2).all(|w| w[0] <= w[1]));
    // Written once: a second flush has nothing.
    assert_eq!(app.app.recorder.flush().await.unwrap(), 0);
}

/// Replay → apply → compare: the candidate's answers predicted from the record are the
/// answers it gives when it runs (and the live side's are the answers given when recorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_predicts_exactly_what_the_candidate_does() {
    let traffic = traffic();
    let live_app = TestApp::spawn_with(Backend::Embedded, recording)
        .await
        .unwrap();
    let live_answers = run(&live_app, &traffic).await;
    let rows = recorded(&live_app).await;
    assert_eq!(rows.len(), traffic.len());

    let candidate = palisade::Settings::candidate_toml(CANDIDATE).unwrap();
    let mut predicted_live = Vec::new();
    let mut predicted = Vec::new();
    let report = palisade::policy::replay::replay(
        &live_app.settings.limits,
        &candidate.limits,
        rows,
        palisade::policy::replay::Signals::Recorded,
        |_, step| {
            predicted_live.push(step.live.as_ref().is_some_and(|d| d.allowed));
            predicted.push(step.candidate.as_ref().is_some_and(|d| d.allowed));
        },
    )
    .await;
    assert_eq!(
        predicted_live, live_answers,
        "the replay of the live policy is what it did"
    );

    let candidate_app = TestApp::spawn_with(Backend::Embedded, |s| {
        s.limits = candidate.limits.clone();
    })
    .await
    .unwrap();
    let candidate_answers = run(&candidate_app, &traffic).await;
    assert_eq!(
        predicted, candidate_answers,
        "the replay predicts the candidate"
    );

    // The report says what changes, per class and with the keys it changes most.
    let read = &report.classes["read"];
    assert!(
        read.newly_refused > 0,
        "anonymous reads lose budget: {report:?}"
    );
    assert!(read.newly_allowed > 0, "the heavy reader gains: {report:?}");
    assert!(report.classes["auth"].newly_refused > 0, "{report:?}");
    // The tenant is recorded (as a pseudonym) and the candidate's tenant budget replayed.
    assert!(report.scopes["read/tenant"].newly_refused > 0, "{report:?}");
    assert_eq!(report.requests, traffic.len() as u64);
    let changed: u64 = report
        .classes
        .values()
        .map(|c| c.newly_refused + c.newly_allowed)
        .sum();
    let differing = predicted_live
        .iter()
        .zip(&predicted)
        .filter(|(a, b)| a != b)
        .count() as u64;
    assert_eq!(changed, differing);
    assert!(
        report.top_keys[0].key.starts_with("user:anon-")
            || report.top_keys[0].key.starts_with("tenant:anon-")
            || report.top_keys[0].key.starts_with("ip:")
    );
    let markdown = report.markdown();
    assert!(
        markdown.contains("| read |") && markdown.contains("newly refused"),
        "{markdown}"
    );
}

/// A candidate file with an error names the setting; recording needs a pseudonym key.
#[test]
fn bad_candidates_and_keyless_recording_are_refused() {
    let err = palisade::Settings::candidate_toml(
        "[[limits.budgets]]\nname = \"x\"\nscope = \"ip\"\nlimit = 0\nperiod_s = 60\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("limit"), "{err}");
    let err = palisade::Settings::candidate_toml("[limits\n")
        .unwrap_err()
        .to_string();
    assert!(err.to_lowercase().contains("line"), "{err}");
    let mut settings = palisade::Settings::default();
    settings.record.enabled = true;
    let err = settings.validate().unwrap_err().to_string();
    assert!(
        err.contains("record.enabled") && err.contains("pseudonym_key"),
        "{err}"
    );
}

/// `palisade replay` against an instance's record: Markdown by default, JSON on request,
/// and a broken candidate file named in one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_command_reports_on_the_record() {
    let app = TestApp::spawn_with(Backend::Embedded, recording)
        .await
        .unwrap();
    let traffic = traffic();
    run(&app, &traffic).await;
    app.app.recorder.flush().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("candidate.toml");
    std::fs::write(&policy, CANDIDATE).unwrap();
    let replay = |args: &[&str]| {
        let mut command = crate::helpers::palisade_command();
        command
            .current_dir(dir.path())
            .env("PALISADE_DATABASE_URL", &app.settings.database_url)
            .arg("replay")
            .args(args)
            .output()
            .unwrap()
    };
    let output = replay(&["--policy", policy.to_str().unwrap(), "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["requests"], traffic.len());
    assert!(
        report["classes"]["read"]["newly_refused"].as_u64().unwrap() > 0,
        "{report}"
    );
    let output = replay(&[
        "--policy",
        policy.to_str().unwrap(),
        "--from",
        "2100-01-01T00:00:00Z",
    ]);
    let text = String::from_utf8(output.stdout).unwrap();
    // Run without the service's `[record]`, the command says recording is off.
    assert!(
        text.contains("Compared with the live [limits] (the settings file's)")
            && text.contains("Replayed no checks: recording is off"),
        "{text}"
    );
    std::fs::write(&policy, "[limits]\nl1_ttl_ms = \"soon\"\n").unwrap();
    let output = replay(&["--policy", policy.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("l1_ttl_ms"), "{stderr}");
}

/// `palisade policy check`: an error with its line and column (exit 1); a usable file's
/// dead rules as warnings and its differences from the live `[limits]` (exit 0).
#[test]
fn policy_check_finds_errors_dead_rules_and_changes() {
    let dir = tempfile::tempdir().unwrap();
    let check = |name: &str, text: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let mut command = crate::helpers::palisade_command();
        let output = command
            .current_dir(dir.path())
            .args(["policy", "check", file.to_str().unwrap()])
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8(output.stdout).unwrap(),
        )
    };
    let (code, out) = check("syntax.toml", "[limits\nx = 1\n");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("syntax.toml:1:8: error:"), "{out}");
    let (code, out) = check(
        "zero.toml",
        "[[limits.budgets]]\nname = \"global\"\nscope = \"global\"\nlimit = 10\nperiod_s = 1\n\n[[limits.budgets]]\nname = \"x\"\nscope = \"ip\"\nlimit = 0\nperiod_s = 60\n",
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("zero.toml:7:1: error: limits.budgets[1] (x)"),
        "{out}"
    );

    let (code, out) = check(
        "dead.toml",
        r#"[limits.classes.partner-login]
paths = ["/auth/partner"]
methods = ["POST"]
fail = "closed"
priority = 20

[[limits.budgets]]
name = "global"
scope = "global"
limit = 50000
period_s = 1

[[limits.budgets]]
name = "anon-user"
scope = "user"
limit = 10
period_s = 60
when = "unauthenticated"
"#,
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(
            "dead.toml:1:1: warning: class partner-login: pattern \"/auth/partner\" is unreachable"
        ) || out.contains(
            "dead.toml:2:1: warning: class partner-login: pattern \"/auth/partner\" is unreachable"
        ),
        "{out}"
    );
    assert!(
        out.contains("dead.toml:13:1: warning: budget anon-user: keyed by the user"),
        "{out}"
    );
    assert!(
        out.contains("change: budget global: 100000 per 1 s"),
        "{out}"
    );
    assert!(out.contains("change: budget auth-account removed"), "{out}");
    assert!(out.contains("change: class partner-login added"), "{out}");
    assert!(out.contains("0 error(s), 2 warning(s)"), "{out}");
    // The live policy checked against itself: nothing to say.
    let example =
        std::fs::read_to_string(crate::helpers::repo_file("palisade.example.toml")).unwrap();
    let (code, out) = check("example.toml", &example);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("0 error(s), 0 warning(s), 0 change(s)"),
        "{out}"
    );
}

fn in_ms(app: &TestApp, ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(app.app.clock.now_ms() + ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

async fn user_multiplier(app: &TestApp, user: &str) -> Value {
    app.admin_json(&format!(
        "/v1/multipliers?user_id={user}&endpoint=/api/items&method=GET&ip=192.0.2.200"
    ))
    .await["keys"][format!("user:{user}")]
    .clone()
}

/// An operator cuts a misbehaving account to 1 % of its read budget and raises a partner
/// beyond the class ceiling; both show in explanations, are listed for analysts, end when
/// removed or expired, and are audited.
async fn overrides_raise_and_cut_one_subject_everywhere_until_they_end(app: TestApp) {
    use crate::helpers::{ADMIN_TOKEN, assert_envelope};
    let app = &app;
    let create =
        |body: Value| async move { app.post("/v1/overrides", Some(ADMIN_TOKEN), &body).await };
    let response = create(
        json!({"account": "spammer", "classes": ["read"], "multiplier": 0.01,
        "expires_at": in_ms(app, 3_600_000), "reason": "scraping the catalogue"}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let cut: Value = response.json().await.unwrap();
    let response = create(
        json!({"account": "partner", "classes": ["read"], "multiplier": 3.0,
        "expires_at": in_ms(app, 600_000), "reason": "launch day"}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);

    // 300 a minute × 0.01: three reads, then 429.
    let read = json!({"endpoint": "/api/items", "method": "GET", "ip": "192.0.2.201", "user_id": "spammer"});
    for _ in 0..3 {
        assert_eq!(app.limit_check(&read).await.status(), StatusCode::OK);
    }
    assert_eq!(
        app.limit_check(&read).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let spammer = user_multiplier(app, "spammer").await;
    assert_eq!(spammer["multiplier"], 0.01, "{spammer}");
    assert!(
        spammer["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("scraping the catalogue")
    );
    // Beyond the class ceiling (2).
    assert_eq!(user_multiplier(app, "partner").await["multiplier"], 3.0);
    // Other classes are untouched.
    let write = app
        .admin_json(
            "/v1/multipliers?user_id=spammer&endpoint=/api/items&method=POST&ip=192.0.2.200",
        )
        .await;
    assert_eq!(write["keys"]["user:spammer"]["multiplier"], 1.0);

    let analyst = app.create_token("analyst", "ana").await.1;
    let listed: Value = app
        .get("/v1/overrides", Some(&analyst))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed}");
    let response = app
        .post(
            "/v1/overrides",
            Some(&analyst),
            &json!({"account": "x", "multiplier": 2.0,
            "expires_at": in_ms(app, 60_000), "reason": "x"}),
        )
        .await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;

    let id = cut["id"].as_str().unwrap();
    let response = app
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/overrides/{id}"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let response = app
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/overrides/{id}?reason=settled"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(user_multiplier(app, "spammer").await["multiplier"], 1.0);
    let response = app
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/overrides/{id}?reason=again"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(response, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    let audit = app.admin_json("/v1/audit?action=override.create").await;
    assert_eq!(audit["items"].as_array().unwrap().len(), 2);
    assert_eq!(
        app.admin_json("/v1/audit?action=override.delete").await["items"][0]["details"]["reason"],
        "settled"
    );

    for body in [
        json!({"account": "a", "ip": "192.0.2.1", "multiplier": 2.0, "expires_at": in_ms(app, 60_000), "reason": "x"}),
        json!({"account": "a", "multiplier": 5000.0, "expires_at": in_ms(app, 60_000), "reason": "x"}),
        json!({"account": "a", "multiplier": 2.0, "expires_at": in_ms(app, -60_000), "reason": "x"}),
        json!({"account": "a", "multiplier": 2.0, "expires_at": in_ms(app, 100 * 86_400_000), "reason": "x"}),
        json!({"account": "a", "classes": ["nope"], "multiplier": 2.0, "expires_at": in_ms(app, 60_000), "reason": "x"}),
        json!({"account": "a", "multiplier": 2.0, "expires_at": in_ms(app, 60_000), "reason": ""}),
        // No budget of the default policy is per tenant.
        json!({"tenant": "acme", "multiplier": 2.0, "expires_at": in_ms(app, 60_000), "reason": "x"}),
    ] {
        assert_envelope(
            create(body).await,
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
        )
        .await;
    }

    // The partner's ends by itself.
    if app.clock.is_some() {
        app.advance(std::time::Duration::from_secs(601)).await;
        app.app.scoring.republish_due().await.unwrap();
        assert_eq!(user_multiplier(app, "partner").await["multiplier"], 1.0);
        let listed: Value = app
            .get("/v1/overrides", Some(&analyst))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(listed["items"], json!([]));
    }
}

/// A canary runs the candidate beside the live policy on every instance: the clients get the
/// live answers, the report counts where the candidate would differ, and a discard ends it.
async fn a_canary_counts_what_the_candidate_would_do_and_never_enforces_it(app: TestApp) {
    use crate::helpers::{ADMIN_TOKEN, assert_envelope};
    let response = app
        .post(
            "/v1/policy/candidates",
            Some(ADMIN_TOKEN),
            &json!({"policy": CANDIDATE, "reason": "try 20 anonymous reads a minute"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let loaded: Value = response.json().await.unwrap();
    // Every instance runs it.
    let other = app.another_instance().await;
    assert_eq!(
        other.app.canary.report().unwrap().id,
        loaded["id"].as_str().unwrap()
    );

    let read = json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.30"});
    for _ in 0..40 {
        assert_eq!(
            app.limit_check(&read).await.status(),
            StatusCode::OK,
            "the canary never enforces"
        );
    }
    let analyst = app.create_token("analyst", "ana").await.1;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let report = loop {
        let report: Value = app
            .get("/v1/policy/candidates/current", Some(&analyst))
            .await
            .json()
            .await
            .unwrap();
        if report["classes"]["read"]["checks"] == 40 || std::time::Instant::now() > deadline {
            break report;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let read_counts = &report["classes"]["read"];
    assert_eq!(
        (
            read_counts["checks"].as_u64(),
            read_counts["same"].as_u64(),
            read_counts["would_refuse"].as_u64(),
            read_counts["would_allow"].as_u64()
        ),
        (Some(40), Some(20), Some(20), Some(0)),
        "{report}"
    );
    assert_eq!(report["scopes"]["read/ip"]["would_refuse"], 20, "{report}");
    assert_eq!(report["reason"], "try 20 anonymous reads a minute");
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("palisade_canary_decisions_total")
                && l.contains("outcome=\"would_refuse\"")),
        "{metrics}"
    );

    for body in [
        json!({"policy": "[limits\n", "reason": "x"}),
        json!({"policy": CANDIDATE, "reason": ""}),
        json!({"policy": CANDIDATE}),
    ] {
        let response = app
            .post("/v1/policy/candidates", Some(ADMIN_TOKEN), &body)
            .await;
        assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    }
    let response = app
        .post(
            "/v1/policy/candidates",
            Some(&analyst),
            &json!({"policy": CANDIDATE, "reason": "x"}),
        )
        .await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;

    let response = app
        .request(
            reqwest::Method::DELETE,
            "/v1/policy/candidates/current?reason=seen%20enough",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let response = app
        .get("/v1/policy/candidates/current", Some(&analyst))
        .await;
    assert_envelope(response, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    other.app.canary.refresh().await.unwrap();
    assert!(
        other.app.canary.report().is_none(),
        "every instance drops it"
    );
    let response = app
        .request(
            reqwest::Method::DELETE,
            "/v1/policy/candidates/current?reason=again",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_envelope(response, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    let audit = app
        .admin_json("/v1/audit?action=policy.canary_discard")
        .await;
    assert_eq!(audit["items"][0]["details"]["reason"], "seen enough");
}

/// The same on the production backend (Postgres record, Redis buckets on Redis time): a
/// burst whose outcome no refill within it can change (anonymous reads refill one token a
/// second), replayed, then run against the candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_replay_predicts_the_candidate_on_redis_too() {
    let Some(live_app) = TestApp::spawn_with(Backend::Production, recording).await else {
        return;
    };
    let burst: Vec<Value> = (0..40)
        .map(|_| json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.40"}))
        .collect();
    let mut live_answers = Vec::new();
    for check in &burst {
        live_answers.push(live_app.limit_check(check).await.status() == StatusCode::OK);
    }
    let rows = recorded(&live_app).await;
    let candidate = palisade::Settings::candidate_toml(CANDIDATE).unwrap();
    let (mut predicted_live, mut predicted) = (Vec::new(), Vec::new());
    palisade::policy::replay::replay(
        &live_app.settings.limits,
        &candidate.limits,
        rows,
        palisade::policy::replay::Signals::Recorded,
        |_, step| {
            predicted_live.push(step.live.as_ref().is_some_and(|d| d.allowed));
            predicted.push(step.candidate.as_ref().is_some_and(|d| d.allowed));
        },
    )
    .await;
    assert_eq!(predicted_live, live_answers);
    let candidate_app = TestApp::spawn_with(Backend::Production, |s| {
        s.limits = candidate.limits.clone();
    })
    .await
    .unwrap();
    let mut candidate_answers = Vec::new();
    for check in &burst {
        candidate_answers.push(candidate_app.limit_check(check).await.status() == StatusCode::OK);
    }
    assert_eq!(predicted, candidate_answers);
    assert_eq!(predicted.iter().filter(|a| **a).count(), 20);
}

/// Logins replayed through a candidate `[lockout]` on the real velocity and lockout code:
/// which accounts it would lock or no longer lock, and which successful logins it would
/// have refused (honest users hurt); the same through `palisade replay`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_replay_names_accounts_newly_locked_and_honest_logins_refused() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    // alice: 10 failures (locked today); bob: 6 failures, then logs in from his phone.
    app.fail("lr-a", "alice", &["203.0.113.60"], 10).await;
    app.fail("lr-b", "bob", &["203.0.113.61"], 6).await;
    app.post_auth(vec![
        json!({"event_id": "lr-ok", "type": "login_success", "account": "bob",
        "ip": "198.51.100.61", "ts": app.human_paced_ts()}),
    ])
    .await;
    let events = palisade::policy::logins::read(&app.app.stores.durable, i64::MIN, i64::MAX, 1000)
        .await
        .unwrap();
    assert_eq!(events.len(), 17);
    // Stricter: lock after 6 failures.
    let mut stricter = app.settings.lockout.clone();
    stricter.challenge_after = 3;
    stricter.lockout_after = 6;
    let report = palisade::login_replay::replay(&app.settings, &stricter, &events)
        .await
        .unwrap();
    assert_eq!(
        (report.locked_live, report.locked_candidate),
        (1, 2),
        "{report:?}"
    );
    assert_eq!(report.newly_locked, ["bob"]);
    assert!(report.no_longer_locked.is_empty());
    assert_eq!(
        (
            report.successes_refused_live,
            report.successes_refused_candidate
        ),
        (0, 1),
        "bob's own login would have been refused: {report:?}"
    );
    // Looser: lock after 20.
    let mut looser = app.settings.lockout.clone();
    looser.lockout_after = 20;
    let report = palisade::login_replay::replay(&app.settings, &looser, &events)
        .await
        .unwrap();
    assert_eq!(report.no_longer_locked, ["alice"]);
    assert_eq!(report.locked_candidate, 0);

    // Through the command, with a candidate file.
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("candidate.toml");
    std::fs::write(
        &policy,
        "[lockout]\nchallenge_after = 3\nlockout_after = 6\n",
    )
    .unwrap();
    let mut command = crate::helpers::palisade_command();
    let output = command
        .current_dir(dir.path())
        .env("PALISADE_DATABASE_URL", &app.settings.database_url)
        .args(["replay", "--policy", policy.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["logins"]["newly_locked"], json!(["bob"]), "{report}");
    assert_eq!(report["logins"]["successes_refused_candidate"], 1);

    // And through the API.
    let simulated = app
        .post(
            "/v1/policy/simulate",
            Some(crate::helpers::ADMIN_TOKEN),
            &json!({"policy": "[lockout]\nchallenge_after = 3\nlockout_after = 6\n",
                "from": "2020-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(simulated.status(), StatusCode::OK);
    let simulated: Value = simulated.json().await.unwrap();
    assert_eq!(
        simulated["logins"]["newly_locked"],
        json!(["bob"]),
        "{simulated}"
    );
    assert_eq!(simulated["logins_truncated"], false);
}

/// One call makes the canary the live policy of every instance, a restarted one included;
/// a candidate with other classes is refused; a revert goes back to the settings file.
async fn a_promoted_canary_is_live_everywhere_until_reverted(app: TestApp) {
    use crate::helpers::{ADMIN_TOKEN, assert_envelope};
    let reads_allowed = |ip: &'static str| {
        let app = &app;
        async move {
            let read = json!({"endpoint": "/api/feed", "method": "GET", "ip": ip});
            let mut allowed = 0;
            for _ in 0..70 {
                if app.limit_check(&read).await.status() == StatusCode::OK {
                    allowed += 1;
                }
            }
            allowed
        }
    };
    let promote = |reason: &'static str| {
        let app = &app;
        async move {
            app.post(
                "/v1/policy/candidates/current/promote",
                Some(ADMIN_TOKEN),
                &json!({ "reason": reason }),
            )
            .await
        }
    };
    assert_envelope(
        promote("nothing to promote").await,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
    )
    .await;
    let loaded: Value = app
        .post(
            "/v1/policy/candidates",
            Some(ADMIN_TOKEN),
            &json!({"policy": CANDIDATE, "reason": "20 anonymous reads a minute"}),
        )
        .await
        .json()
        .await
        .unwrap();
    let analyst = app.create_token("analyst", "ana").await.1;
    assert_envelope(
        app.get("/v1/policy/candidates/last", Some(&analyst)).await,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
    )
    .await;
    // The canary counts 70 reads of one address: 40 the live policy allows it would refuse.
    assert_eq!(reads_allowed("192.0.2.40").await, 60);
    for _ in 0..200 {
        let counted = app.app.canary.report().unwrap().classes["read"].checks;
        if counted >= 70 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_envelope(
        app.post(
            "/v1/policy/candidates/current/promote",
            Some(&analyst),
            &json!({"reason": "x"}),
        )
        .await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
    let response = promote("the canary looked right").await;
    assert_eq!(response.status(), StatusCode::OK);
    let live: Value = response.json().await.unwrap();
    assert_eq!(live["source"], "promoted");
    assert_eq!(live["id"], loaded["id"]);
    // Its report stays readable, and is in the promotion's audit entry.
    let last: Value = app
        .get("/v1/policy/candidates/last", Some(&analyst))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(last["id"], loaded["id"]);
    assert_eq!(last["promoted"], true);
    assert_eq!(
        last["report"]["classes"]["read"]["would_refuse"], 40,
        "{last}"
    );
    let audit = app.admin_json("/v1/audit?action=policy.promote").await;
    assert_eq!(
        audit["items"][0]["details"]["report"], last["report"],
        "{audit}"
    );
    assert_eq!(
        reads_allowed("192.0.2.41").await,
        20,
        "the candidate's budget enforces"
    );
    let status: Value = app
        .get("/v1/policy/live", Some(&analyst))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["source"], "promoted");
    let canary = app
        .get("/v1/policy/candidates/current", Some(&analyst))
        .await;
    assert_envelope(canary, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    // Another instance, and one started afterwards, run it too.
    let started = app.another_instance().await;
    assert_eq!(started.app.canary.live().source, "promoted");
    let read = json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.42"});
    let mut allowed = 0;
    for _ in 0..30 {
        if started.limit_check(&read).await.status() == StatusCode::OK {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 20);
    // Another set of classes is not promoted.
    let other_classes = format!(
        "{CANDIDATE}\n[limits.classes.search]\npaths = [\"/search*\"]\nmethods = []\nfail = \"open\"\nshadow = false\npriority = 5\n"
    );
    let response = app
        .post(
            "/v1/policy/candidates",
            Some(ADMIN_TOKEN),
            &json!({"policy": other_classes, "reason": "a search class"}),
        )
        .await;
    // Refused at submission, with the message a promotion would give.
    let refused = assert_envelope(response, StatusCode::CONFLICT, "CONFLICT").await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a promotion keeps the classes in force"),
        "{refused}"
    );
    assert_envelope(
        promote("a search class").await,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
    )
    .await;
    assert_eq!(
        app.app.canary.live().source,
        "promoted",
        "the promoted one stays"
    );
    // Revert: the settings file's 60 a minute again, everywhere.
    let response = app
        .post(
            "/v1/policy/live/revert",
            Some(ADMIN_TOKEN),
            &json!({"reason": "back"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.json::<Value>().await.unwrap()["source"],
        "settings"
    );
    assert_eq!(reads_allowed("192.0.2.43").await, 60);
    started.app.canary.refresh().await.unwrap();
    assert_eq!(started.app.canary.live().source, "settings");
    let response = app
        .post(
            "/v1/policy/live/revert",
            Some(ADMIN_TOKEN),
            &json!({"reason": "again"}),
        )
        .await;
    assert_envelope(response, StatusCode::NOT_FOUND, "NOT_FOUND").await;
    for action in ["policy.promote", "policy.revert"] {
        let audit = app.admin_json(&format!("/v1/audit?action={action}")).await;
        assert_eq!(
            audit["items"].as_array().map(Vec::len),
            Some(1),
            "{action}: {audit}"
        );
    }
}

/// A partner's budget: every request made for tenant `acme` (by any user, from any address,
/// over HTTP, forward-auth or Envoy) takes from one bucket; other tenants and requests
/// without one are not touched. An override on the tenant raises it for a launch and shows
/// in its explanation.
async fn a_tenant_budget_is_shared_by_its_requests_and_its_override_scales_it(app: TestApp) {
    use crate::gateways::{Envoy, descriptor, forward};
    use crate::helpers::{ADMIN_TOKEN, assert_envelope};
    use palisade::api::envoy::proto::RateLimitRequest;
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, |s| {
        s.limits.budgets.push(crate::helpers::partner_budget(6));
    })
    .await
    .unwrap();
    let read = |i: usize, tenant: &str| {
        json!({"endpoint": "/api/feed", "ip": format!("192.0.2.{}", 30 + i),
               "user_id": format!("member-{i}"), "tenant": tenant})
    };
    for i in 0..4 {
        let response = app.limit_check(&read(i, "acme")).await;
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
    }
    // Forward-auth and Envoy carry the tenant too: the same bucket.
    let through_proxy = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/api/feed"),
        ("x-forwarded-for", "198.51.100.40"),
        ("x-tenant-id", "acme"),
    ];
    let response = forward(&app, Some(ADMIN_TOKEN), "", &through_proxy).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut envoy = Envoy::start(&app).await;
    let envoy_read = |ip: &str, tenant: &str| RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![
            descriptor(&[("remote_address", ip)]),
            descriptor(&[("tenant", tenant)]),
            descriptor(&[("path", "/api/feed"), ("method", "GET")]),
        ],
        hits_addend: 0,
    };
    let answer = envoy
        .call(Some(ADMIN_TOKEN), envoy_read("198.51.100.41", "acme"))
        .await
        .unwrap();
    assert_eq!(
        answer.overall_code, 1,
        "the sixth request is within the budget"
    );
    let answer = envoy
        .call(Some(ADMIN_TOKEN), envoy_read("198.51.100.42", "acme"))
        .await
        .unwrap();
    assert_eq!(answer.overall_code, 2, "the seventh is over it");
    let refused = app.limit_check(&read(9, "acme")).await;
    let envelope = assert_envelope(refused, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(
        envelope["error"]["details"]["scope"], "tenant",
        "{envelope}"
    );
    assert_eq!(
        envelope["error"]["details"]["reason"], "tenant_rate",
        "{envelope}"
    );
    let response = forward(&app, Some(ADMIN_TOKEN), "", &through_proxy).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another tenant, and a request without one, are untouched.
    assert_eq!(
        app.limit_check(&read(9, "globex")).await.status(),
        StatusCode::OK
    );
    let untenanted = json!({"endpoint": "/api/feed", "ip": "192.0.2.39", "user_id": "member-9"});
    assert_eq!(app.limit_check(&untenanted).await.status(), StatusCode::OK);
    // A tenant id is checked like any id.
    let bad = app.limit_check(&read(1, "acme\u{0007}")).await;
    assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;

    // Launch day: a partner gets three times its budget (a raise sets how fast a bucket
    // fills and how much it holds; tokens already taken stay taken).
    let response = app
        .post(
            "/v1/overrides",
            Some(ADMIN_TOKEN),
            &json!({"tenant": "initech", "classes": ["read"], "multiplier": 3.0,
                    "expires_at": in_ms(&app, 3_600_000), "reason": "initech launch"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.unwrap();
    assert_eq!(created["subject"], "tenant:initech");
    let mut allowed = 0;
    for i in 0..24 {
        if app.limit_check(&read(i % 8, "initech")).await.status() == StatusCode::OK {
            allowed += 1;
        }
    }
    // 18 tokens (Redis time may refill a fraction of one).
    assert!(
        (18..=19).contains(&allowed),
        "{allowed} allowed after the raise"
    );
    let explained = app
        .admin_json("/v1/multipliers?tenant=initech&endpoint=/api/feed")
        .await;
    let key = &explained["keys"]["tenant:initech"];
    assert_eq!(key["multiplier"], 3.0, "{explained}");
    assert!(
        key["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("initech launch"),
        "{explained}"
    );
    // One subject per override.
    let response = app
        .post(
            "/v1/overrides",
            Some(ADMIN_TOKEN),
            &json!({"tenant": "acme", "account": "a", "multiplier": 2.0,
                    "expires_at": in_ms(&app, 60_000), "reason": "x"}),
        )
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}
