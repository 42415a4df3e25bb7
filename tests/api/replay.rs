//! A replay that predicts with scoring on: the multipliers the live limiter applied are kept
//! with each recorded check and replayed, so a repeat offender halved and an account cut by
//! an override replay as they ran; the record's pseudonyms are the ones logs show.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp};
use palisade::policy::replay::{Signals, replay};

const KEY: &str = "replay-test-pseudonym-key-0123456789abcdef";

/// The live budgets with readers given twice theirs and accounts fewer logins; the anonymous
/// budget (the one the repeat offender meets) stays, so scoring flags the same clients under
/// both policies.
fn candidate(live: &palisade::config::LimitSettings) -> palisade::config::LimitSettings {
    let mut limits = live.clone();
    for budget in &mut limits.budgets {
        match budget.name.as_str() {
            "user-read" => budget.limit = 600,
            "auth-account" => budget.limit = 3,
            _ => {}
        }
    }
    limits
}

fn recording(s: &mut palisade::Settings) {
    s.privacy.pseudonym_key = Some(palisade::config::Secret::new(KEY));
    s.record.enabled = true;
}

/// One 200 ms tick's checks: a scraper without an account (5/s, a repeat offender within a
/// minute), an honest anonymous reader (1/s), a signed-in reader (2/s) and a login every 5 s.
fn tick(i: usize) -> Vec<Value> {
    let mut out = vec![json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.30"})];
    if i.is_multiple_of(5) {
        out.push(json!({"endpoint": "/api/feed", "method": "GET", "ip": "192.0.2.31"}));
    }
    if matches!(i % 5, 0 | 2) {
        out.push(
            json!({"endpoint": format!("/api/items/{i}"), "method": "GET",
            "ip": "192.0.2.32", "user_id": "reader"}),
        );
    }
    if i.is_multiple_of(25) {
        out.push(
            json!({"endpoint": "/auth/login", "method": "POST", "ip": "192.0.2.33",
            "user_id": "victim"}),
        );
    }
    out
}

const TICKS: usize = 750;

/// Runs 150 s of traffic with scoring's offender flush each second and, at 30 s, an
/// analyst's override cutting the reader to a quarter; every answer, in order.
async fn run(app: &TestApp) -> Vec<bool> {
    let mut answers = Vec::new();
    for i in 0..TICKS {
        if i == 150 {
            let until = chrono::DateTime::from_timestamp_millis(app.app.clock.now_ms() + 3_600_000)
                .unwrap()
                .to_rfc3339();
            let response = app
                .post(
                    "/v1/overrides",
                    Some(ADMIN_TOKEN),
                    &json!({"account": "reader", "classes": ["read"], "multiplier": 0.25,
                        "expires_at": until, "reason": "scraping with an account"}),
                )
                .await;
            assert_eq!(response.status(), StatusCode::CREATED);
        }
        for check in tick(i) {
            let status = app.limit_check(&check).await.status();
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{status}"
            );
            answers.push(status == StatusCode::OK);
        }
        app.advance(std::time::Duration::from_millis(200)).await;
        if i % 5 == 4 {
            app.app.scoring.flush_offenders().await.unwrap();
        }
    }
    answers
}

/// Replay → apply → compare with scoring on: replaying the recorded multipliers predicts the
/// live answers and the candidate's exactly; holding them at 1 does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_with_the_recorded_multipliers_predicts_what_scoring_did() {
    let live_app = TestApp::spawn_with(Backend::Embedded, recording)
        .await
        .unwrap();
    let live_answers = run(&live_app).await;
    live_app.app.recorder.flush().await.unwrap();
    let rows = palisade::policy::record::read(
        &live_app.app.stores.durable,
        i64::MIN,
        i64::MAX,
        None,
        100_000,
    )
    .await
    .unwrap();
    assert_eq!(rows.len(), live_answers.len());
    // The record holds what was answered and the signals behind it.
    assert!(rows.iter().all(|r| r.outcome.is_some()));
    assert!(
        rows.iter().any(|r| r.multipliers.ip < 1.0),
        "the scraper became a repeat offender"
    );
    assert!(rows.iter().any(|r| r.multipliers.user == 0.25));

    // One pseudonym scheme: the record's keys are the ones logs show.
    let shown = live_app.app.scoring.pseudonyms();
    let reader = rows.iter().find(|r| r.user.is_some()).unwrap();
    assert_eq!(
        format!("user:{}", reader.user.as_deref().unwrap()),
        shown.shown_key("user:reader")
    );
    let logged_ip = shown.shown_key("ip:192.0.2.32");
    let hex: String = reader
        .ip
        .trim_end_matches("::1")
        .split(':')
        .map(|group| format!("{:0>4}", group))
        .collect::<String>();
    assert_eq!(
        &hex[2..],
        &logged_ip["ip:anon-".len().."ip:anon-".len() + 14],
        "{} is {logged_ip}",
        reader.ip
    );

    let limits = &live_app.settings.limits;
    let candidate = candidate(limits);
    let mut predicted_live = Vec::new();
    let mut predicted = Vec::new();
    let report = replay(
        limits,
        &candidate,
        rows.clone(),
        Signals::Recorded,
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
    for (class, change) in &report.classes {
        assert_eq!(change.recorded, change.requests, "{class}");
        assert_eq!(change.mispredicted, 0, "{class}: {change:?}");
    }
    assert!(report.classes["read"].newly_allowed > 0, "{report:?}");
    assert!(report.classes["auth"].newly_refused > 0, "{report:?}");

    let candidate_app = TestApp::spawn_with(Backend::Embedded, |s| {
        s.limits = candidate.clone();
    })
    .await
    .unwrap();
    let candidate_answers = run(&candidate_app).await;
    assert_eq!(
        predicted, candidate_answers,
        "the replay predicts the candidate"
    );

    // Held at 1, the replay misses what scoring did: the offender's and the reader's cuts.
    let mut held = Vec::new();
    let flat = replay(limits, &candidate, rows, Signals::One, |_, step| {
        held.push(step.candidate.as_ref().is_some_and(|d| d.allowed))
    })
    .await;
    assert_ne!(held, candidate_answers);
    let read = &flat.classes["read"];
    assert!(read.prediction_error() > 0.005, "{read:?}");
    assert!(flat.markdown().contains("multipliers held at 1"));
    assert!(report.markdown().contains("multipliers as recorded"));
}
