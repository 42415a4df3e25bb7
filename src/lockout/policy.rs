//! The lockout policy, pure: counts in, action and reasons out.

use serde::Serialize;

use crate::config::{Escalation, LockoutSettings};
pub use crate::model::Reason;

/// What the auth service must do with the next login attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Proceed.
    None,
    /// Require a step-up challenge (CAPTCHA, OTP, …).
    Challenge,
    /// Refuse: the account is locked (for this context).
    Lockout,
}

/// Failure counts of one login context in the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Failures of the account, from anywhere.
    pub account: u32,
    /// Failures of the account from this IP.
    pub pair_ip: u32,
    /// Failures of the account from this device.
    pub pair_device: u32,
    /// Two failures of the account closer than a human types.
    pub too_fast: bool,
}

/// True when an account's failures in the window lock it.
pub fn locks(account_failures: u32, settings: &LockoutSettings) -> bool {
    account_failures >= settings.lockout_after
}

/// The action for a context without an existing lockout.
pub fn decide(counts: Counts, settings: &LockoutSettings) -> (Action, Vec<Reason>) {
    let mut reasons = Vec::new();
    let window_min = settings.window_s / 60;
    if locks(counts.account, settings) {
        reasons.push(Reason::new(
            "account_failures",
            format!(
                "{} failures of this account in {window_min} min (lockout at {})",
                counts.account, settings.lockout_after
            ),
        ));
        return (Action::Lockout, reasons);
    }
    let challenge = settings.challenge_after;
    if counts.account >= challenge {
        reasons.push(Reason::new(
            "account_failures",
            format!(
                "{} failures of this account in {window_min} min (challenge at {challenge})",
                counts.account
            ),
        ));
    }
    if counts.pair_ip >= challenge {
        reasons.push(Reason::new(
            "account_ip_failures",
            format!("{} failures from this IP", counts.pair_ip),
        ));
    }
    if counts.pair_device >= challenge {
        reasons.push(Reason::new(
            "account_device_failures",
            format!("{} failures from this device", counts.pair_device),
        ));
    }
    if counts.too_fast {
        reasons.push(Reason::new(
            "faster_than_human",
            format!(
                "two failures less than {} ms apart",
                settings.human_interval_ms
            ),
        ));
    }
    let action = if reasons.is_empty() {
        Action::None
    } else {
        Action::Challenge
    };
    (action, reasons)
}

/// Duration of a lockout at `level` (1 = first within the decay period), seconds; `None`
/// means permanent (until an analyst releases it).
pub fn lockout_seconds(level: u32, settings: &LockoutSettings) -> Option<u64> {
    if settings.permanent_after > 0 && level > settings.permanent_after {
        return None;
    }
    let base = settings.base_lockout_s;
    let seconds = match settings.escalation {
        Escalation::None => base,
        Escalation::Linear => base.saturating_mul(u64::from(level)),
        Escalation::Multiple => {
            let exponent = level.saturating_sub(1).min(63);
            base.saturating_mul(u64::from(settings.escalation_factor).saturating_pow(exponent))
        }
    };
    Some(seconds.min(settings.max_lockout_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_challenge_ten_lock() {
        let settings = LockoutSettings::default();
        let at = |account| {
            decide(
                Counts {
                    account,
                    ..Counts::default()
                },
                &settings,
            )
            .0
        };
        assert_eq!(at(4), Action::None);
        assert_eq!(at(5), Action::Challenge);
        assert_eq!(at(9), Action::Challenge);
        assert_eq!(at(10), Action::Lockout);
    }

    #[test]
    fn pairs_and_speed_challenge() {
        let settings = LockoutSettings::default();
        let (action, reasons) = decide(
            Counts {
                pair_device: 5,
                ..Counts::default()
            },
            &settings,
        );
        assert_eq!(action, Action::Challenge);
        assert_eq!(reasons[0].code, "account_device_failures");
        let (action, reasons) = decide(
            Counts {
                too_fast: true,
                ..Counts::default()
            },
            &settings,
        );
        assert_eq!(action, Action::Challenge);
        assert_eq!(reasons[0].code, "faster_than_human");
    }

    #[test]
    fn lockout_escalation_doubles_up_to_24h() {
        let settings = LockoutSettings::default();
        let minutes: Vec<u64> = (1..=9)
            .map(|level| lockout_seconds(level, &settings).unwrap() / 60)
            .collect();
        assert_eq!(minutes, vec![15, 30, 60, 120, 240, 480, 960, 1440, 1440]);
        let linear = LockoutSettings {
            escalation: Escalation::Linear,
            ..LockoutSettings::default()
        };
        assert_eq!(lockout_seconds(3, &linear), Some(2700));
        let permanent = LockoutSettings {
            permanent_after: 3,
            ..LockoutSettings::default()
        };
        assert_eq!(lockout_seconds(3, &permanent), Some(3600));
        assert_eq!(lockout_seconds(4, &permanent), None);
    }
}
