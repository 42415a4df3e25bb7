//! The accuracy scenarios of `benches/scenarios` in small: carrier NAT and stuffing spread
//! over many networks on both backends, their goals asserted (the bench reports every
//! scenario in full in `docs/ACCURACY.md`).

#[path = "../../benches/scenarios/engine.rs"]
mod engine;

use crate::helpers::TestApp;
use crate::on_both_backends;

on_both_backends!(
    carrier_nat_hurts_no_honest_user_and_stops_both_attackers,
    a_crowd_behind_one_carrier_address_is_not_refused,
    stuffing_over_many_networks_is_stopped_once_the_login_guard_is_on,
    stuffing_diluted_with_the_attackers_own_logins_is_stopped_too,
    a_forced_re_login_of_every_user_challenges_nobody,
    sms_pumping_to_a_premium_range_is_stopped_and_honest_codes_go_out,
    a_flooded_phone_gets_no_more_codes_than_its_budget,
    a_retry_storm_challenges_nobody,
    budgets_suggested_from_the_scenarios_traffic_keep_their_goals,
);

/// Time 20x faster than production.
const SCALE: u64 = 20;

/// Runs a scenario of 200 users over 120 simulated seconds on an app of `app`'s backend
/// with every period divided by [`SCALE`].
async fn run_small(app: TestApp, scenario: fn(engine::Size) -> engine::Scenario) -> engine::Report {
    run_users(app, scenario, 200).await
}

/// [`run_small`] with `users` users.
async fn run_users(
    app: TestApp,
    scenario: fn(engine::Size) -> engine::Scenario,
    users: u32,
) -> engine::Report {
    run_sized(
        app,
        scenario,
        engine::Size {
            users,
            duration_s: 120,
        },
    )
    .await
}

/// Runs a scenario of `size` on an app of `app`'s backend.
async fn run_sized(
    app: TestApp,
    scenario: fn(engine::Size) -> engine::Scenario,
    size: engine::Size,
) -> engine::Report {
    let app = TestApp::spawn_with(app.backend, |settings| {
        engine::scale_settings(settings, SCALE)
    })
    .await
    .unwrap();
    engine::run(&app, &scenario(size), SCALE).await
}

async fn carrier_nat_hurts_no_honest_user_and_stops_both_attackers(app: TestApp) {
    let report = run_small(app, engine::carrier_nat).await;
    // Goal: at most 0.5 % of honest users see any 429.
    assert!(engine::Report::pct(report.users) <= 0.5, "{report:?}");
    // Both attackers are stopped after their budget: each account locks after 10 failures.
    let admitted = report.attacker.0 - report.attacker.1;
    assert!(report.attacker.0 > 200, "{report:?}");
    assert!(admitted <= 20, "{admitted} guesses got through: {report:?}");
    assert!(
        report.first_block_ms.is_some_and(|ms| ms <= 10_000),
        "{report:?}"
    );
}

async fn stuffing_over_many_networks_is_stopped_once_the_login_guard_is_on(app: TestApp) {
    let report = run_small(app, engine::distributed_stuffing).await;
    // Goal: ≥ 99 % of the attempts after the first refusal or challenge stopped (refused,
    // or challenged and never passed).
    assert!(report.attacker.0 > 1000, "{report:?}");
    assert!(
        engine::Report::pct(report.attacker_after_first) >= 99.0,
        "{report:?}"
    );
    assert!(
        report.first_block_ms.is_some_and(|ms| ms <= 20_000),
        "{report:?}"
    );
    // The users signing in for the first time (1 in 20) are challenged, not refused.
    assert!(engine::Report::pct(report.users) <= 0.5, "{report:?}");
    let challenged = engine::Report::pct((report.users.0, report.users_challenged));
    assert!(challenged <= 10.0, "{challenged} % challenged: {report:?}");
    assert!(report.users_challenged > 0, "{report:?}");
}

/// 600 customers of one carrier address log in within 5 s with the phones they used there
/// before: more logins than the address-wide ceiling holds (500), every one let through.
async fn a_crowd_behind_one_carrier_address_is_not_refused(app: TestApp) {
    let report = run_users(app, engine::carrier_flash_crowd, 600).await;
    // Goal: at most 0.5 % of honest users see any 429.
    assert!(engine::Report::pct(report.users) <= 0.5, "{report:?}");
}

/// The attacker keeps failures under half of all logins with logins of its own accounts,
/// after four quiet windows of the guard (3 s each here, 60 simulated seconds): the guard,
/// having learned the normal of the quiet ones, turns on anyway.
async fn stuffing_diluted_with_the_attackers_own_logins_is_stopped_too(app: TestApp) {
    let app = TestApp::spawn_with(app.backend, |settings| {
        engine::scale_settings(settings, SCALE);
        settings.lockout.stuffing.window_s = 3;
    })
    .await
    .unwrap();
    let size = engine::Size {
        users: 200,
        duration_s: 120,
    };
    let report = engine::run(&app, &engine::diluted_stuffing_after(size, 280), SCALE).await;
    assert!(report.attacker.0 > 1000, "{report:?}");
    assert!(
        report.first_block_ms.is_some_and(|ms| ms <= 20_000),
        "{report:?}"
    );
    assert!(
        engine::Report::pct(report.attacker_after_first) >= 99.0,
        "{report:?}"
    );
    assert!(engine::Report::pct(report.users) <= 0.5, "{report:?}");
}

/// Every user logs in again within a minute, 3 % mistyping: no attack, no challenge.
async fn a_forced_re_login_of_every_user_challenges_nobody(app: TestApp) {
    let report = run_users(app, engine::forced_relogin, 600).await;
    assert_eq!(report.users_challenged, 0, "{report:?}");
    assert!(engine::Report::pct(report.users) <= 0.5, "{report:?}");
}

async fn sms_pumping_to_a_premium_range_is_stopped_and_honest_codes_go_out(app: TestApp) {
    let report = run_small(app, engine::sms_pumping).await;
    // Goals: ≥ 99 % of the attempts after the first refusal refused, the first within 10 s;
    // at most 0.5 % of honest users refused a code.
    assert!(report.attacker.0 > 200, "{report:?}");
    assert!(
        engine::Report::pct(report.attacker_after_first) >= 99.0,
        "{report:?}"
    );
    assert!(
        report.first_block_ms.is_some_and(|ms| ms <= 10_000),
        "{report:?}"
    );
    // The cost: the premium range's tenth of 100 an hour, and nothing more.
    let sent = report.attacker.0 - report.attacker.1;
    assert!(
        sent <= 11,
        "{sent} messages sent to the premium range: {report:?}"
    );
    assert!(engine::Report::pct(report.users) <= 0.5, "{report:?}");
}

async fn a_flooded_phone_gets_no_more_codes_than_its_budget(app: TestApp) {
    let report = run_small(app, engine::otp_flood).await;
    // 3 codes per 10 minutes reach the number, however many accounts and addresses ask and
    // however they spell it: over the 110 s of the attack, 3 and the refill of 110 s.
    assert!(report.attacker.0 > 50, "{report:?}");
    let sent = report.attacker.0 - report.attacker.1;
    assert!(sent <= 4, "{sent} codes reached the phone: {report:?}");
    assert!(engine::Report::pct(report.users) <= 0.5, "{report:?}");
}

/// Back from an outage, every app signs in again and sends more queued reads than its
/// budget: nobody is challenged (the guard stays off: every login is from a known context).
/// On the embedded backend, whose clock only the simulation moves, a client that retries as
/// docs/CLIENTS.md asks sends fewer requests for the same reads than one that retries every
/// 250 ms; on Redis real time decides how many retries a 250 ms client needs, so only the
/// guard is asserted there.
async fn a_retry_storm_challenges_nobody(app: TestApp) {
    let backend = app.backend;
    let report = run_users(app, engine::retry_storm, 100).await;
    assert_eq!(report.users_challenged, 0, "{report:?}");
    assert!(
        report.honest.1 > 0,
        "the storm is over the budget: {report:?}"
    );
    if backend == crate::helpers::Backend::Embedded {
        let [(polite, polite_attempts, _), (rude, rude_attempts, _)] = report.retried;
        let per_request = |attempts: u64, requests: u64| attempts as f64 / requests.max(1) as f64;
        assert!(
            per_request(rude_attempts, rude) > per_request(polite_attempts, polite),
            "{report:?}"
        );
    }
}

/// The suggestion loop on the scenarios' own traffic: each is recorded, budgets are
/// suggested from the record (`palisade policy suggest`'s defaults), and the scenario runs
/// again with the suggestion live. Every goal holds: at most 0.5 % of honest users refused,
/// and where the live policy stopped ≥ 99 % of the attacker's attempts after the first
/// refusal, the suggestion does too.
async fn budgets_suggested_from_the_scenarios_traffic_keep_their_goals(app: TestApp) {
    use palisade::policy::suggest::{Options, propose};

    let backend = app.backend;
    let scenarios: [fn(engine::Size) -> engine::Scenario; 4] = [
        engine::carrier_nat,
        engine::distributed_stuffing,
        engine::forced_relogin,
        engine::sms_pumping,
    ];
    let size = engine::Size {
        users: 200,
        duration_s: 120,
    };
    for scenario in scenarios {
        let recorded = TestApp::spawn_with(backend, |settings| {
            engine::scale_settings(settings, SCALE);
            settings.privacy.pseudonym_key = Some(palisade::config::Secret::new(
                "scenario-suggest-pseudonym-key-0123456789",
            ));
            settings.record.enabled = true;
        })
        .await
        .unwrap();
        let live = engine::run(&recorded, &scenario(size), SCALE).await;
        recorded.app.recorder.flush().await.unwrap();
        let proposal = propose(
            &recorded.app.stores.durable,
            (&recorded.settings, &recorded.settings.limits),
            (i64::MIN, i64::MAX),
            Options::default(),
            usize::MAX,
        )
        .await
        .unwrap();
        let suggestion = &proposal.suggestion;
        assert!(suggestion.records > 0, "{}", live.name);
        let changed: Vec<String> = suggestion
            .budgets
            .iter()
            .filter(|b| b.suggested != b.live)
            .map(|b| format!("{} {} -> {}", b.budget, b.live, b.suggested))
            .collect();
        assert!(
            !changed.is_empty(),
            "{}: nothing suggested\n{}",
            live.name,
            proposal.markdown()
        );

        let candidate = suggestion.candidate.clone();
        let suggested = TestApp::spawn_with(backend, move |settings| {
            engine::scale_settings(settings, SCALE);
            settings.limits = candidate;
        })
        .await
        .unwrap();
        let with = engine::run(&suggested, &scenario(size), SCALE).await;
        let why = format!(
            "{}: {changed:?}\nlive {live:?}\nsuggested {with:?}",
            live.name
        );
        // One row of docs/ACCURACY.md's table of suggested budgets.
        let after = |r: &engine::Report| {
            if r.attacker.0 == 0 {
                "–".to_owned()
            } else {
                format!("{:.1} %", engine::Report::pct(r.attacker_after_first))
            }
        };
        eprintln!(
            "| `{}` | {backend:?} | {} | {:.2} % → {:.2} % of {} | {} → {} |",
            live.name,
            changed.join(", "),
            engine::Report::pct(live.users),
            engine::Report::pct(with.users),
            with.users.0,
            after(&live),
            after(&with)
        );
        assert!(engine::Report::pct(with.users) <= 0.5, "{why}");
        if live.attacker.0 > 0 && engine::Report::pct(live.attacker_after_first) >= 99.0 {
            assert!(
                engine::Report::pct(with.attacker_after_first) >= 99.0,
                "{why}"
            );
        }
    }
}
