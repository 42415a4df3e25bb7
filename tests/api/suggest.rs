//! Budgets from real traffic: `GET /v1/policy/suggestions` and `palisade policy suggest` on
//! a recorded window of honest readers and a scraper, on both backends: the suggestion
//! follows the honest keys, stops the scraper sooner, passes `policy check`, is the same
//! each time, and keeps honest refusals within its target on a hold-out it was not computed
//! from.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp};
use crate::on_both_backends;

on_both_backends!(a_suggestion_follows_honest_keys_and_proves_itself_on_a_hold_out);

const KEY: &str = "suggest-test-pseudonym-key-0123456789abcdef";

/// Time runs this many times faster than the simulated minutes (a budget's 60 s is 3 s), so
/// the production backend, on Redis time, waits out 48 s rather than 16 minutes.
const SCALE: u64 = 20;

/// Anonymous readers, signed-in readers, and minutes of traffic.
const READERS: u64 = 30;
const SIGNED_IN: u64 = 10;
const MINUTES: u64 = 16;

/// A reader's checks in minute `m`: 2–21 anonymous, 5–80 signed in, varying by minute.
fn anonymous(reader: u64, m: u64) -> u64 {
    2 + (reader * 7 + m * 3) % 20
}

fn signed_in(reader: u64, m: u64) -> u64 {
    5 + (reader * 13 + m * 11) % 76
}

/// Runs `MINUTES` of simulated traffic in 10 s ticks: each reader spreads its minute's checks over the
/// six ticks; a scraper without an account asks 200 times a minute.
async fn run(app: &TestApp) -> u64 {
    let mut checks = 0;
    for m in 0..MINUTES {
        for tick in 0..6 {
            let started = std::time::Instant::now();
            let share = |count: u64| (count + tick) / 6;
            let mut bodies = Vec::new();
            for r in 0..READERS {
                for _ in 0..share(anonymous(r, m)) {
                    bodies.push(json!({"endpoint": "/api/feed", "method": "GET",
                        "ip": format!("198.51.100.{}", r + 1)}));
                }
            }
            for r in 0..SIGNED_IN {
                for _ in 0..share(signed_in(r, m)) {
                    bodies.push(json!({"endpoint": "/api/items/7", "method": "GET",
                        "ip": format!("203.0.113.{}", r + 1), "user_id": format!("reader-{r}")}));
                }
            }
            for _ in 0..share(200) {
                bodies.push(json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.99"}));
            }
            for body in &bodies {
                let status = app.limit_check(body).await.status();
                assert!(
                    status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                    "{status}"
                );
            }
            checks += bodies.len() as u64;
            // 10 simulated seconds: the manual clock jumps, real time is waited out.
            let step = std::time::Duration::from_millis(10_000 / SCALE);
            match app.clock {
                Some(_) => app.advance(step).await,
                None => tokio::time::sleep(step.saturating_sub(started.elapsed())).await,
            }
        }
    }
    checks
}

fn budget<'a>(proposal: &'a Value, name: &str) -> &'a Value {
    proposal["suggestion"]["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["budget"] == name)
        .unwrap_or_else(|| panic!("no budget {name}: {proposal}"))
}

/// An app of `backend` (time scaled, recording on) that served `MINUTES` of the readers and
/// the scraper, its record written; and the checks it made.
pub(crate) async fn recorded(backend: crate::helpers::Backend) -> (TestApp, u64) {
    let app = TestApp::spawn_with(backend, |s| {
        s.privacy.pseudonym_key = Some(palisade::config::Secret::new(KEY));
        s.record.enabled = true;
        for budget in &mut s.limits.budgets {
            if budget.period_s > 1 {
                budget.period_s = (budget.period_s / SCALE as u32).max(1);
            }
        }
    })
    .await
    .unwrap();
    let checks = run(&app).await;
    app.app.recorder.flush().await.unwrap();
    (app, checks)
}

async fn a_suggestion_follows_honest_keys_and_proves_itself_on_a_hold_out(app: TestApp) {
    let (app, checks) = recorded(app.backend).await;

    let response = app.get("/v1/policy/suggestions", Some(ADMIN_TOKEN)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let proposal: Value = response.json().await.unwrap();
    assert_eq!(proposal["suggestion"]["records"], checks, "{proposal}");

    // The anonymous budget follows the readers (at most 21 a minute: × 1.25 → 30; on real
    // time a window may catch a seventh tick) and stops the scraper, whose key-windows are
    // flagged (over a quarter of its checks refused).
    let exact = app.clock.is_some();
    let n = |v: &Value| v.as_u64().unwrap();
    let follows = |b: &Value, most: u64| {
        let max = n(&b["max"]);
        assert!(max <= most + most.div_ceil(6), "{b}");
        assert_eq!(
            n(&b["suggested"]),
            u64::from(palisade::policy::suggest::readable(max as f64 * 1.25)),
            "{b}"
        );
        if exact {
            assert_eq!(max, most, "{b}");
        }
    };
    let anon = budget(&proposal, "ip-anon");
    assert_eq!(anon["live"], 60);
    follows(anon, 21);
    assert_eq!(anon["honest_over_suggested"], 0, "{anon}");
    assert!(
        anon["flagged_keys"].as_u64().unwrap() >= MINUTES - 1,
        "{anon}"
    );
    assert!(
        anon["flagged_over_suggested"].as_u64().unwrap() >= MINUTES - 1,
        "{anon}"
    );
    assert!(
        anon["flagged_stopped"][0]["key"]
            .as_str()
            .unwrap()
            .starts_with("fd")
    );
    // Signed-in readers (5–80 a minute) set the per-user read budget: 80 × 1.25 = 100.
    follows(budget(&proposal, "user-read"), 80);
    // A budget no check met keeps its value.
    let auth = budget(&proposal, "auth-account");
    assert_eq!(auth["suggested"], auth["live"]);

    // Replayed over the same window: the scraper is refused more, honest readers no more.
    let read = &proposal["replay"]["classes"]["read"];
    assert!(n(&read["flagged"]) > 0, "{read}");
    assert!(
        n(&read["flagged_refused_candidate"]) > n(&read["flagged_refused_live"]),
        "{read}"
    );
    let honest_refused_candidate =
        n(&read["refused_candidate"]) - n(&read["flagged_refused_candidate"]);
    assert!(
        honest_refused_candidate * 1000 <= n(&read["requests"]) - n(&read["flagged"]),
        "{read}"
    );

    // 16 minutes span ten of the longest period (a minute): a hold-out of the last quarter,
    // within the target.
    let holdout = &proposal["holdout"];
    assert!(holdout.is_object(), "{proposal}");
    assert!(n(&holdout["replay"]["requests"]) > 0);
    assert!(
        holdout["honest_refused_pct"].as_f64().unwrap() <= holdout["target_pct"].as_f64().unwrap(),
        "{holdout}"
    );
    assert!((holdout["target_pct"].as_f64().unwrap() - 0.1).abs() < 1e-9);

    // The candidate passes `policy check` against the live policy and is deterministic.
    let toml = proposal["suggestion"]["toml"].as_str().unwrap();
    let findings = palisade::policy::check::check(toml, &app.settings.limits);
    assert!(
        findings
            .iter()
            .all(|f| f.level != palisade::policy::check::Level::Error),
        "{findings:?}"
    );
    let again: Value = app
        .get("/v1/policy/suggestions", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["suggestion"], proposal["suggestion"]);
    assert_eq!(again["holdout"]["suggested"], holdout["suggested"]);

    // Options and windows: bad values are a 400 in the envelope; an empty window says why.
    for query in [
        "honest=0",
        "honest=101",
        "headroom=0.5",
        "headroom=abc",
        "from=yesterday",
        "from=2100-01-02T00:00:00Z&to=2100-01-01T00:00:00Z",
        "window=1",
    ] {
        let response = app
            .get(
                &format!("/v1/policy/suggestions?{query}"),
                Some(ADMIN_TOKEN),
            )
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"]["code"].is_string(), "{query}: {body}");
    }
    let empty: Value = app
        .get(
            "/v1/policy/suggestions?from=2100-01-01T00:00:00Z&to=2100-01-02T00:00:00Z",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert!(
        empty["empty"]
            .as_str()
            .unwrap()
            .contains("no checks were made"),
        "{empty}"
    );

    // The CLI: the same suggestion, written as a file `policy check` accepts.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("candidate.toml");
    // The instance's (scaled) budgets as the settings file the CLI reads.
    std::fs::write(
        dir.path().join("palisade.toml"),
        palisade::policy::suggest::limits_toml(&app.settings.limits),
    )
    .unwrap();
    let cli = |args: &[&str]| {
        let mut command = crate::helpers::palisade_command();
        command
            .current_dir(dir.path())
            .env("PALISADE_DATABASE_URL", &app.settings.database_url)
            .args(args)
            .output()
            .unwrap()
    };
    let output = cli(&["policy", "suggest", "--out", out.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("| ip-anon | ip | 3 s |") && text.contains("Hold-out: suggested from"),
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), toml);
    let output = cli(&["policy", "check", out.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let output = cli(&["policy", "suggest", "--honest", "0"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("honest must be"));
}
