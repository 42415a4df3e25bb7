//! `[lockout]`: login-velocity windows, challenge/lockout policy, escalation, spraying.

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// How repeat lockouts of one account grow (Keycloak's wait strategies, plus a cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Escalation {
    /// `base × factor^(level − 1)`.
    Multiple,
    /// `base × level`.
    Linear,
    /// Always `base`.
    None,
}

/// What a login from a context its account does not know gets while its network is
/// blocked or the login guard is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownContext {
    /// Allowed with a challenge (`login_guard` or `network_blocked`, and a challenge id):
    /// the app asks for a step-up it already has, and the auth service reports
    /// `challenge_passed`, which makes the context known to the account.
    Challenge,
    /// Refused (429 `login_guard` or `ip_blocked`).
    Refuse,
}

/// The `[lockout]` section. Defaults are DESIGN.md's "Default policy".
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LockoutSettings {
    /// Sliding window of failure counting, seconds. TOML `lockout.window_s`; default 600.
    pub window_s: u64,
    /// Failures of an account, or of an account+IP / account+device pair, in the window that
    /// require a step-up challenge. TOML `lockout.challenge_after`; default 5.
    pub challenge_after: u32,
    /// Failures of an account in the window that lock it. TOML `lockout.lockout_after`;
    /// default 10.
    pub lockout_after: u32,
    /// Two failures of one account closer than this (ms) are "faster than a human" and
    /// require a challenge. TOML `lockout.human_interval_ms`; default 1000 (0 = off).
    pub human_interval_ms: u64,
    /// First lockout's duration, seconds. TOML `lockout.base_lockout_s`; default 900.
    pub base_lockout_s: u64,
    /// Growth of repeat lockouts: `multiple`, `linear` or `none`. Default `multiple`.
    pub escalation: Escalation,
    /// Factor of `multiple` escalation. Default 2.
    pub escalation_factor: u32,
    /// Longest lockout, seconds. Default 86400.
    pub max_lockout_s: u64,
    /// Lockouts within this many seconds of the previous one escalate; a quiet period this
    /// long resets the level. Default 86400.
    pub decay_s: u64,
    /// After this many temporary lockouts within `decay_s`, lock until an analyst releases
    /// (0 = never). Default 0.
    pub permanent_after: u32,
    /// Distinct accounts failing from one IP (or device) in the window that mark it as
    /// spraying. Default 20.
    pub spray_accounts: u32,
    /// How long a spraying IP/device gets multiplier 0 on the `auth` class, seconds.
    /// Default 1800.
    pub spray_block_s: u64,
    /// Distinct accounts failing from one network (an IPv4 /24, an IPv6 /48) in the window
    /// that mark it as spraying when more accounts fail from it than logged in from it
    /// successfully in the last `limits.shared_ip.window_s` (attackers rotating addresses;
    /// a carrier's busy network has more successes). The block is renewed for
    /// `spray_block_s` when logins on as many accounts, from contexts they do not know, are
    /// refused there in its second half. 0 turns it off. Default 40 (at most 256).
    pub network_spray_accounts: u32,
    /// The same for one autonomous system (needs an ASN database in `data/`). 0 turns it
    /// off. Default 50 (at most 256).
    pub asn_spray_accounts: u32,
    /// Distinct accounts failing from one network or ASN in the window, more than logged
    /// in from it, that make it suspected of spraying for `spray_block_s` (renewed like a
    /// block): logins there from contexts their accounts do not know get a login challenge
    /// (`network_spraying`), known contexts and requests naming no account pass as before.
    /// Sees spraying spread thin long before the block's threshold. 0 turns it off.
    /// Default 6.
    pub suspect_accounts: u32,
    /// How long a successful login's IP and device stay "known" for the lockout-DoS rule,
    /// days. Default 90.
    pub known_for_days: u64,
    /// Raw auth events and OTP delivery events older than this are pruned, days (lockouts
    /// are kept). Default 30.
    pub retention_days: u64,
    /// Factor on the `auth` class of an account with `challenge_after` or more failures in
    /// the window (before any lockout). Default 0.5.
    pub failure_factor: f64,
    /// Failures from one IP (any accounts) in the window that tighten the IP on the `auth`
    /// class by `failure_factor`. Default 50.
    pub ip_failures: u32,
    /// What a login from a context its account does not know gets while the login guard
    /// is on or its network is blocked for spraying: `challenge` (allowed with a step-up
    /// challenge the app can pass; unsolved ones count as failures) or `refuse`. Default
    /// `challenge`.
    pub unknown_context: UnknownContext,
    /// How long a login challenge can be reported passed, seconds. Default 600.
    pub challenge_ttl_s: u64,
    /// The service-wide login guard against stuffing spread over many networks
    /// (`[lockout.stuffing]`).
    pub stuffing: StuffingSettings,
}

/// `[lockout.stuffing]`: the service-wide login guard.
///
/// When failed logins from contexts their accounts do not know reach `min_failures` in
/// `window_s` and make up `failure_share` of all logins (or `surge_factor` times their
/// learned normal), logins from such contexts get a login challenge for `hold_s` (the
/// challenges count as failures, so it holds while the attack goes on).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StuffingSettings {
    /// Failed logins from contexts their accounts do not know, service-wide in `window_s`
    /// (logins stopped from such contexts count too, once per client: an IPv4 address, an
    /// IPv6 /64; failures from known contexts do not) before the login guard may turn on; 0
    /// turns the guard off. Default 100.
    pub min_failures: u64,
    /// Share of all logins in the window that must have failed for the guard to turn on,
    /// from 0 to 1. Default 0.5.
    pub failure_share: f64,
    /// The guard's window, seconds. Default 300.
    pub window_s: u64,
    /// How long the guard stays on after the window last tipped it, seconds; while it is on,
    /// a login from a context its account does not know gets a login challenge on `auth`
    /// (reason `login_guard`). Default 900.
    pub hold_s: u64,
    /// Once the service's normal count of failures from unknown contexts in a window is
    /// learned for the hour of the day (three windows of it judged with the guard off),
    /// this many times that normal (and at least `min_failures`) turns the guard on
    /// whatever their share of all logins, so logins of the attacker's own accounts cannot
    /// dilute it. Default 10.
    pub surge_factor: f64,
}

impl Default for StuffingSettings {
    fn default() -> Self {
        Self {
            min_failures: 100,
            failure_share: 0.5,
            window_s: 300,
            hold_s: 900,
            surge_factor: 10.0,
        }
    }
}

impl StuffingSettings {
    fn validate(&self) -> Result<(), SettingError> {
        if self.surge_factor.is_nan() || self.surge_factor < 1.0 {
            return Err(SettingError::new(
                setting_name("lockout.stuffing.surge_factor"),
                "must be at least 1",
            ));
        }
        if self.failure_share.is_nan() || !(0.0..=1.0).contains(&self.failure_share) {
            return Err(SettingError::new(
                setting_name("lockout.stuffing.failure_share"),
                "must be between 0 and 1",
            ));
        }
        for (key, value) in [
            ("lockout.stuffing.window_s", self.window_s),
            ("lockout.stuffing.hold_s", self.hold_s),
        ] {
            if value == 0 {
                return Err(SettingError::new(setting_name(key), "must be at least 1"));
            }
        }
        Ok(())
    }
}

impl Default for LockoutSettings {
    fn default() -> Self {
        Self {
            window_s: 600,
            challenge_after: 5,
            lockout_after: 10,
            human_interval_ms: 1000,
            base_lockout_s: 900,
            escalation: Escalation::Multiple,
            escalation_factor: 2,
            max_lockout_s: 86_400,
            decay_s: 86_400,
            permanent_after: 0,
            spray_accounts: 20,
            spray_block_s: 1800,
            network_spray_accounts: 40,
            asn_spray_accounts: 50,
            suspect_accounts: 6,
            known_for_days: 90,
            retention_days: 30,
            failure_factor: 0.5,
            ip_failures: 50,
            unknown_context: UnknownContext::Challenge,
            challenge_ttl_s: 600,
            stuffing: StuffingSettings::default(),
        }
    }
}

impl LockoutSettings {
    pub(super) fn validate(&self) -> Result<(), SettingError> {
        let positive = [
            ("lockout.window_s", self.window_s),
            ("lockout.challenge_after", u64::from(self.challenge_after)),
            ("lockout.lockout_after", u64::from(self.lockout_after)),
            ("lockout.base_lockout_s", self.base_lockout_s),
            (
                "lockout.escalation_factor",
                u64::from(self.escalation_factor),
            ),
            ("lockout.max_lockout_s", self.max_lockout_s),
            ("lockout.decay_s", self.decay_s),
            ("lockout.spray_accounts", u64::from(self.spray_accounts)),
            ("lockout.spray_block_s", self.spray_block_s),
            ("lockout.known_for_days", self.known_for_days),
            ("lockout.retention_days", self.retention_days),
            ("lockout.ip_failures", u64::from(self.ip_failures)),
            ("lockout.challenge_ttl_s", self.challenge_ttl_s),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(SettingError::new(setting_name(key), "must be at least 1"));
        }
        if self.challenge_after > self.lockout_after {
            return Err(SettingError::new(
                setting_name("lockout.challenge_after"),
                "must not be greater than lockout.lockout_after",
            ));
        }
        if self.failure_factor.is_nan() || !(0.0..=1.0).contains(&self.failure_factor) {
            return Err(SettingError::new(
                setting_name("lockout.failure_factor"),
                "must be between 0 and 1",
            ));
        }
        if self.network_spray_accounts > 256
            || self.asn_spray_accounts > 256
            || self.suspect_accounts > 256
        {
            return Err(SettingError::new(
                setting_name("lockout.network_spray_accounts"),
                "network and ASN thresholds are at most 256 (their windows keep that many)",
            ));
        }
        if self.lockout_after > 1000 || self.spray_accounts > 1000 || self.ip_failures > 1000 {
            return Err(SettingError::new(
                setting_name("lockout.lockout_after"),
                "thresholds are at most 1000 (windows keep at most that many entries)",
            ));
        }
        if self.base_lockout_s > self.max_lockout_s {
            return Err(SettingError::new(
                setting_name("lockout.base_lockout_s"),
                "must not be greater than lockout.max_lockout_s",
            ));
        }
        self.stuffing.validate()
    }
}
