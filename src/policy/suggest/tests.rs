//! The suggestion's counts and rounding on hand-made records.

use super::*;
use crate::policy::record::Multipliers;

fn check(at_ms: i64, ip: &str, user: Option<&str>, outcome: Outcome) -> Recorded {
    Recorded {
        id: String::new(),
        at_ms,
        method: "GET".to_owned(),
        endpoint: "/api/feed".to_owned(),
        ip: ip.to_owned(),
        user: user.map(str::to_owned),
        device: None,
        tenant: None,
        cost: 1,
        consume: true,
        outcome: Some(outcome),
        multipliers: Multipliers::default(),
    }
}

#[test]
fn readable_numbers_round_up() {
    let cases = [
        (0.2, 1),
        (3.1, 4),
        (10.0, 10),
        (11.0, 12),
        (13.0, 15),
        (47.0, 50),
        (61.0, 80),
        (101.0, 120),
        (2_600.0, 3_000),
    ];
    for (x, want) in cases {
        assert_eq!(readable(x), want, "{x}");
    }
}

/// 100 honest anonymous readers making 1–30 reads a minute and a scraper flagged by its
/// multiplier making 600: the suggestion follows the readers, the scraper is over it.
#[test]
fn the_honest_distribution_sets_the_value_and_flagged_keys_do_not() {
    let live = LimitSettings::default();
    let mut summary = Summary::new(&live);
    let start = 1_800_000_000_000;
    for minute in 0..3 {
        let t0 = start + minute * 60_000;
        let mut checks = Vec::new();
        for reader in 0..100 {
            for i in 0..(1 + reader % 30) {
                let ip = format!("fd00::{reader:x}");
                checks.push(check(t0 + i * 1000 + reader, &ip, None, Outcome::Allowed));
            }
        }
        for i in 0..600 {
            let mut r = check(t0 + i * 100, "fd00::ffff", None, Outcome::Refused);
            r.multipliers.ip = 0.5;
            checks.push(r);
        }
        checks.sort_by_key(|r| r.at_ms);
        for r in &checks {
            summary.add(r);
        }
    }
    let suggestion = summary.suggest(&live, Options::default());
    let anon = suggestion
        .budgets
        .iter()
        .find(|b| b.budget == "ip-anon")
        .unwrap();
    assert_eq!(anon.honest_keys, 300, "{anon:?}");
    assert_eq!(anon.flagged_keys, 3);
    assert_eq!(anon.max, Some(30));
    // 30 × 1.25 = 37.5 → 40.
    assert_eq!(anon.suggested, 40, "{anon:?}");
    assert_eq!(anon.honest_over_suggested, 0);
    assert_eq!(anon.flagged_over_suggested, 3);
    assert_eq!(anon.flagged_stopped[0].key, "fd00::ffff");
    assert!(anon.flagged_stopped[0].stopped_by_live);
    // Budgets no check met keep their values; the candidate parses and holds them all.
    let auth = suggestion
        .budgets
        .iter()
        .find(|b| b.budget == "auth-ip")
        .unwrap();
    assert_eq!(auth.suggested, auth.live);
    let parsed = crate::config::Settings::candidate_toml(&suggestion.toml).unwrap();
    assert_eq!(parsed.limits.budgets.len(), live.budgets.len());
    let limit = |name: &str| {
        parsed
            .limits
            .budgets
            .iter()
            .find(|b| b.name == name)
            .unwrap()
            .limit
    };
    assert_eq!(limit("ip-anon"), 40);
    assert!(
        suggestion
            .markdown()
            .contains("| ip-anon | ip | 60 s | 300 |")
    );
}

/// A key with more than a quarter of its checks refused is no honest key, whatever its
/// multipliers; one refused a quarter of the time or less is.
#[test]
fn a_key_that_keeps_asking_after_its_refusals_is_flagged() {
    let live = LimitSettings::default();
    let mut summary = Summary::new(&live);
    for (ip, refused) in [("fd00::1", 26), ("fd00::2", 25)] {
        for i in 0..100 {
            let outcome = if i < 100 - refused {
                Outcome::Allowed
            } else {
                Outcome::Refused
            };
            summary.add(&check(1_800_000_000_000 + i, ip, None, outcome));
        }
    }
    let suggestion = summary.suggest(&live, Options::default());
    let anon = &suggestion
        .budgets
        .iter()
        .find(|b| b.budget == "ip-anon")
        .unwrap();
    assert_eq!((anon.honest_keys, anon.flagged_keys), (1, 1));
    assert_eq!(anon.max, Some(100));
    // 100 × 1.25 = 125 → 150.
    assert_eq!(anon.suggested, 150);
    assert_eq!(summary_flagged(), ["fd00::1"]);
}

/// The flagged keys a summary keeps when asked, for the replay's honest/flagged split.
fn summary_flagged() -> Vec<String> {
    let live = LimitSettings::default();
    let mut summary = Summary::new(&live).collecting_flagged();
    for i in 0..100 {
        let outcome = if i < 50 {
            Outcome::Allowed
        } else {
            Outcome::Refused
        };
        summary.add(&check(1_800_000_000_000 + i, "fd00::1", None, outcome));
        summary.add(&check(
            1_800_000_000_000 + i,
            "fd00::2",
            None,
            Outcome::Allowed,
        ));
    }
    let mut keys: Vec<String> = summary.finish().flagged_keys().into_iter().collect();
    keys.sort();
    keys
}
