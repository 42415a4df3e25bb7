//! The guard's judgement on an in-process store and a manual clock.

use super::*;
use crate::clock::ManualClock;

fn ip(n: u32) -> ClientIp {
    ClientIp::parse(&std::net::Ipv4Addr::from(0x0a00_0000 + n).to_string(), 64).unwrap()
}

fn guard(clock: Arc<ManualClock>) -> LoginGuard {
    LoginGuard::new(
        StuffingSettings {
            min_failures: 100,
            failure_share: 0.5,
            window_s: 300,
            hold_s: 900,
            surge_factor: 10.0,
        },
        Hot::Memory(crate::store::MemoryHot::new()),
        &Keys::new("t"),
        clock,
    )
}

#[test]
fn turns_on_for_many_failures_that_are_most_logins_and_holds_while_refusals_go_on() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let guard = guard(clock.clone());
    // Honest traffic: a tenth of logins fail; many failures, but a small share.
    guard.count(150, 0, 1350);
    assert!(!guard.is_active());
    // Most logins fail, but too few to judge.
    clock.advance(std::time::Duration::from_millis(301_000));
    guard.count(97, 0, 10);
    assert!(!guard.is_active());
    // One address refused again and again counts once.
    for _ in 0..50 {
        guard.refused(&ip(1));
    }
    // The many addresses of one IPv6 /64 count once too.
    for n in 0..50u32 {
        let v6 = format!("2001:db8:1:2::{n:x}");
        guard.refused(&ClientIp::parse(&v6, 64).unwrap());
    }
    assert!(!guard.is_active());
    assert_eq!(guard.state().failures, 99);
    guard.count(1, 0, 0);
    assert!(guard.is_active(), "100 failures of 110 logins");
    // While on, refusals from many addresses keep it on past its hold; a window after
    // they stop, it lapses.
    for round in 0..6 {
        clock.advance(std::time::Duration::from_millis(300_000));
        guard.count(0, 0, 20);
        for n in 0..200 {
            guard.refused(&ip(round * 1000 + n));
        }
        assert!(guard.is_active());
    }
    clock.advance(std::time::Duration::from_millis(899_000));
    guard.count(0, 0, 50);
    assert!(
        guard.is_active(),
        "on for its hold after the last judgement"
    );
    clock.advance(std::time::Duration::from_millis(2_000));
    assert!(!guard.is_active());
    assert_eq!(
        guard.state().failures,
        0,
        "the window has moved past the refusals"
    );
}

#[test]
fn failures_from_known_contexts_never_turn_it_on() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let guard = guard(clock.clone());
    // Every user logs in again after an app update, or resets a password: failures
    // from their own phones and networks, as many as the successes.
    guard.count(0, 5_000, 5_000);
    assert!(!guard.is_active());
    assert_eq!(guard.state().failures, 5_000);
    assert_eq!(guard.state().unknown_failures, 0);
}

/// 22:00:00 UTC, so an hour of windows stays in one hour of the day.
const TOP_OF_AN_HOUR: i64 = 1_699_999_200_000;

#[test]
fn once_the_normal_is_learned_successes_cannot_dilute_it() {
    // Stuffing diluted with logins of the attacker's own accounts: 150 failures from
    // unknown contexts, 1000 successes (13 %). Nothing learned yet: the share decides.
    let clock = Arc::new(ManualClock::new(TOP_OF_AN_HOUR));
    let fresh = guard(clock.clone());
    fresh.count(150, 0, 1000);
    assert!(!fresh.is_active());
    assert!(!fresh.state().learned);
    // Three quiet windows: 8 failures from unknown contexts each.
    let guard = guard(clock.clone());
    guard.count(8, 20, 1000);
    for _ in 0..3 {
        clock.advance(std::time::Duration::from_secs(300));
        guard.count(8, 20, 1000);
    }
    let state = guard.state();
    assert!(state.learned, "{state:?}");
    assert_eq!(state.normal, Some(8.0));
    assert_eq!(
        state.threshold, 100,
        "10 x the normal, at least min_failures"
    );
    // The same diluted run now turns it on.
    clock.advance(std::time::Duration::from_secs(300));
    guard.count(150, 0, 1000);
    assert!(guard.is_active(), "{:?}", guard.state());
}

#[test]
fn a_large_service_learns_its_normal_and_is_judged_against_it() {
    let clock = Arc::new(ManualClock::new(TOP_OF_AN_HOUR));
    let guard = guard(clock.clone());
    // 500 failures from unknown contexts a window is this service's normal (new users
    // mistyping): a third of its logins.
    guard.count(500, 0, 1000);
    for _ in 0..4 {
        clock.advance(std::time::Duration::from_secs(300));
        guard.count(500, 0, 1000);
        assert!(!guard.is_active(), "{:?}", guard.state());
    }
    assert_eq!(guard.state().threshold, 5_000);
    clock.advance(std::time::Duration::from_secs(300));
    guard.count(5_000, 0, 20_000);
    assert!(
        guard.is_active(),
        "ten times the normal: {:?}",
        guard.state()
    );
}

#[test]
fn failures_kept_under_the_threshold_raise_the_normal_slowly() {
    let clock = Arc::new(ManualClock::new(TOP_OF_AN_HOUR));
    let guard = guard(clock.clone());
    guard.count(10, 0, 1000);
    for _ in 0..3 {
        clock.advance(std::time::Duration::from_secs(300));
        guard.count(10, 0, 1000);
    }
    assert_eq!(guard.state().threshold, 100);
    // A slow run just under the threshold for the rest of the hour.
    for _ in 0..7 {
        clock.advance(std::time::Duration::from_secs(300));
        guard.count(99, 0, 1000);
    }
    let normal = guard.state().normal.unwrap();
    assert!(normal < 25.0, "{normal}");
}

#[tokio::test]
async fn a_release_keeps_it_off_until_it_ends() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let guard = guard(clock.clone());
    guard.count(200, 0, 0);
    assert!(guard.is_active());
    guard.release(1_700_000_600_000).await.unwrap();
    assert!(!guard.is_active());
    guard.count(200, 0, 0);
    assert!(!guard.is_active(), "no judgement while released");
    clock.advance(std::time::Duration::from_secs(601));
    assert!(!guard.is_active(), "the release ended nothing on by itself");
    guard.count(200, 0, 0);
    assert!(guard.is_active());
}

#[test]
fn off_when_min_failures_is_zero() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let guard = LoginGuard::new(
        StuffingSettings {
            min_failures: 0,
            ..StuffingSettings::default()
        },
        Hot::Memory(crate::store::MemoryHot::new()),
        &Keys::new("t"),
        clock,
    );
    guard.count(10_000, 0, 0);
    assert!(!guard.is_active());
}
