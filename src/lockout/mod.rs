//! Login velocity, challenges and lockouts.
//!
//! Owns the sliding-window counters (hot store, [`velocity`]) and lockout records (durable
//! store, [`store`]). Decides `none | challenge | lockout` in [`policy::decide`], which is
//! pure; read it first. Does not know HTTP: `api::lockouts` maps [`Lockout`] to JSON.
//!
//! Lockout-DoS rule: an account lockout refuses attempts only from contexts the account does
//! **not** know: a device, IP or IP network (/24, /64) it logged in from successfully within
//! `known_for_days`, or an attested device. A known context gets a challenge at worst, so
//! knowing a victim's account name is not enough to lock the victim out of their own phone.
//! [`Lockouts::status`] and, through [`Lockouts::exemption`], the limiter (and with it
//! Envoy and forward-auth) apply the same rule.

mod challenges; // login challenges for contexts an account does not know
mod locks; // storing and announcing lockouts (one instance wins each)
pub mod policy; // the pure decision: counts in, action and reasons out
mod record; // a batch's window operations and each failure's consequences
mod restore; // markers of the lockouts in force, put back after the hot store lost its data
mod review; // listing, one lockout, release
mod rule; // the lockout-DoS rule as the limiter's Exemptions socket
mod spraying; // blocking and suspecting sources that fail on many accounts
mod status; // the status of a login context and the lockout-DoS rule
mod store; // SQL of lockouts
mod tried; // logins a source's own budget refused, counted as spraying evidence
pub mod velocity; // the hot side: windows, lock markers, known contexts

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use challenges::{ChallengeRejection, challenge_id_valid};
pub use policy::{Action, Reason};
pub use rule::LockoutRule;
pub use tried::LOGIN_CLASS;

use crate::audit::Audit;
use crate::clock::Clock;
use crate::config::LockoutSettings;
use crate::model::{ClientIp, SubjectKey};
use crate::scoring::Engine;
use crate::store::{Durable, Hot, Keys, Stores};
use velocity::{Step, WindowAction, WindowCounts};

/// A lockout record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lockout {
    /// ULID.
    pub id: String,
    /// The account.
    pub account: String,
    /// What is locked: `account`.
    pub scope: String,
    /// Reason code, e.g. `account_failures`.
    pub reason: String,
    /// Failures in the window when it was created.
    pub failures: u32,
    /// Escalation level (1 = first within the decay period).
    pub level: u32,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Unix ms (far future for a permanent lockout).
    pub locked_until_ms: i64,
    /// Unix ms, if released.
    pub released_at_ms: Option<i64>,
    /// Name of the token that released it.
    pub released_by: Option<String>,
    /// Why it was released.
    pub release_reason: Option<String>,
}

/// A failure event that caused a lockout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockoutEvent {
    /// The auth service's event id.
    pub event_id: String,
    /// `login_failure` or `login_success`.
    pub kind: String,
    /// Account (canonical id).
    pub account: String,
    /// The account as the auth service spelled it, when different.
    pub account_received: Option<String>,
    /// Client IP.
    pub ip: String,
    /// Device, if sent.
    pub device_id: Option<String>,
    /// Endpoint, if sent.
    pub endpoint: Option<String>,
    /// Event time, Unix ms.
    pub ts_ms: i64,
}

/// Which lockouts to list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Not released and not yet expired.
    #[default]
    Active,
    /// Released by an analyst.
    Released,
    /// Ran out by themselves.
    Expired,
    /// Every lockout.
    All,
}

/// A filter and page position for [`Lockouts::list`].
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Status filter.
    pub status: Status,
    /// Only this account.
    pub account: Option<String>,
    /// Only lockouts caused by a failure from this address or network.
    pub ip: Option<ipnetwork::IpNetwork>,
    /// Only lockouts caused by a failure from an address of this ASN.
    pub asn: Option<u32>,
    /// Only lockouts caused by a failure from this device.
    pub device_id: Option<String>,
    /// Only lockouts with this reason code.
    pub reason: Option<String>,
    /// Only lockouts created at or after this Unix ms.
    pub since_ms: Option<i64>,
    /// Only lockouts created before this Unix ms.
    pub until_ms: Option<i64>,
    /// Only lockouts older than this id (the previous page's cursor).
    pub before: Option<ulid::Ulid>,
    /// Page size 1..=500.
    pub limit: u32,
}

/// What the auth service must do for one login context.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountStatus {
    /// The action.
    pub action: Action,
    /// Until when, if locked (Unix ms).
    pub locked_until_ms: Option<i64>,
    /// The lockout, if locked.
    pub lockout_id: Option<String>,
    /// Failures of the account in the window.
    pub failures_in_window: u32,
    /// Why.
    pub reasons: Vec<Reason>,
}

/// One login attempt's subjects, parsed at the boundary.
#[derive(Debug, Clone)]
pub struct LoginContext {
    /// The account (`user:…`, the key the limiter's auth budgets use).
    pub account: SubjectKey,
    /// The account name as sent.
    pub account_name: String,
    /// Client IP.
    pub ip: ClientIp,
    /// The IP's subject (`ip:…`, an IPv6 client's prefix), made once per attempt.
    pub ip_key: SubjectKey,
    /// Device, if known.
    pub device: Option<SubjectKey>,
}

/// A batch's window counts and lock markers from [`Lockouts::record_windows`], for
/// [`Lockouts::settle`].
#[derive(Debug)]
pub struct Recorded {
    counts: WindowCounts,
    spans: Vec<std::ops::Range<usize>>,
    locks: Vec<Option<velocity::Marker>>,
    now: i64,
}

/// One login event to record ([`Lockouts::record_events`]).
#[derive(Debug, Clone, Copy)]
pub struct LoginEvent<'a> {
    /// Who, from where.
    pub context: &'a LoginContext,
    /// The event's id (failures are counted by it, so a retry counts nothing twice).
    pub event_id: &'a str,
    /// When, Unix ms.
    pub ts_ms: i64,
    /// A failure (else a success, or a passed challenge).
    pub failure: bool,
    /// A passed login challenge (`challenge_passed`): the context becomes known to the
    /// account, and nothing else is counted (it is not a login).
    pub step_up: bool,
}

/// Why a lockout operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No lockout with this id.
    #[error("no lockout with id {0:?}")]
    NotFound(String),
    /// Released before.
    #[error("lockout {0} is already released")]
    AlreadyReleased(String),
    /// A lockout that is no longer in force cannot be moved.
    #[error("lockout {0} is not in force (released or expired)")]
    NotActive(String),
    /// A search by network or ASN that names (or must look at) more addresses seen in
    /// auth events than one search may.
    #[error("{0}")]
    TooBroad(String),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

impl From<crate::scoring::Error> for Error {
    fn from(err: crate::scoring::Error) -> Self {
        match err {
            crate::scoring::Error::Store(store) => Error::Store(store),
        }
    }
}

/// The lockout service.
#[derive(Debug)]
pub struct Lockouts {
    durable: Durable,
    hot: Hot,
    /// The hot store on its own connection, for the status queries (see
    /// [`crate::store::RedisHot::interactive`]).
    status_hot: Hot,
    keys: Keys,
    clock: Arc<dyn Clock>,
    settings: LockoutSettings,
    scoring: Arc<Engine>,
    audit: Audit,
    /// Attested devices count as known contexts.
    attested: Arc<dyn AttestedDevices>,
}

/// Whether a device holds a fresh attestation verdict of device integrity or better (the
/// socket attestation plugs into; `app` wires it).
pub trait AttestedDevices: Send + Sync + std::fmt::Debug {
    /// True when `device` is attested now.
    fn is_attested<'a>(
        &'a self,
        device: &'a SubjectKey,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>>;
}

/// A locked account's context that the account knows: what it gets instead of the lockout.
#[derive(Debug, Clone, PartialEq)]
pub struct Exemption {
    /// The account's multiplier without the lockout (its other factors still apply).
    pub multiplier: f64,
    /// The lockout it is exempt from.
    pub lockout_id: String,
}

/// Name of the velocity signal in factors and reasons.
pub const SIGNAL: &str = "velocity";

/// The quick-login window in an account's value: its failures by claimed time (clamped to
/// the time of receipt), for comparing failures with their neighbours in time.
const QUICK: &str = "q";

/// Failures kept in the quick-login window: its smallest gap is all that is read of it.
const QUICK_CAP: usize = 16;

/// The distinct accounts that logged in successfully from an IP, in the IP's value: enough
/// of them make it a shared address (`limits.shared_ip`). Also in a network's and an ASN's
/// value, where failures on more accounts than that mean spraying.
const SHARED: &str = "s";

/// The distinct accounts whose logins a network's or an ASN's block refused from contexts
/// they do not know, in its value (late in a block: the spraying goes on).
const REFUSED: &str = "b";

/// Entries kept in a network's or an ASN's windows (their thresholds are at most this).
const NETWORK_CAP: usize = 256;

impl Lockouts {
    /// The service. It is the
    /// velocity signal: `scoring` receives its factors (an account's failures and lockout,
    /// spraying IPs and devices, IPs failing often), all on the `auth` class.
    pub fn new(
        stores: &Stores,
        clock: Arc<dyn Clock>,
        settings: LockoutSettings,
        scoring: Arc<Engine>,
        audit: Audit,
        attested: Arc<dyn AttestedDevices>,
    ) -> Self {
        Self {
            durable: stores.durable.clone(),
            hot: stores.hot.clone(),
            status_hot: stores.hot.interactive(),
            keys: stores.keys.clone(),
            clock,
            settings,
            scoring,
            audit,
            attested,
        }
    }

    fn window_ms(&self) -> i64 {
        i64::try_from(self.settings.window_s.saturating_mul(1000)).unwrap_or(i64::MAX)
    }

    /// The account's windows of an attempt in this context (in its window value): all its
    /// failures, those from this IP, from this device.
    fn context_windows(&self, context: &LoginContext) -> Vec<(String, String)> {
        let key = self.keys.windows(&context.account);
        let mut windows = vec![
            (key.clone(), "f".to_owned()),
            (key.clone(), velocity::pair_window('i', &context.ip_key)),
        ];
        if let Some(device) = &context.device {
            windows.push((key, velocity::pair_window('d', device)));
        }
        windows
    }

    /// The window operations of `events` in order, received at `now`, and each event's span
    /// of them; the quick-login window of each failure named in `gaps` also reports its
    /// smallest gap.
    fn event_steps(
        &self,
        events: &[LoginEvent<'_>],
        gaps: &[usize],
        now: i64,
    ) -> (Vec<Step>, Vec<std::ops::Range<usize>>) {
        let mut steps = Vec::new();
        let mut spans = Vec::with_capacity(events.len());
        for event in events {
            let start = steps.len();
            if event.failure {
                self.failure_steps(event, now, &mut steps);
            } else if event.step_up {
                self.known_steps(event, now, &mut steps);
            } else {
                self.success_steps(event, now, &mut steps);
            }
            spans.push(start..steps.len());
        }
        for &i in gaps {
            if events[i].failure {
                steps[spans[i].end - 1].gap = true;
            }
        }
        (steps, spans)
    }

    /// The sources a context's network spraying is judged on, each with its threshold: its
    /// network (`lockout.network_spray_accounts`) and its ASN (`lockout.asn_spray_accounts`),
    /// those turned on.
    pub(super) fn networks(&self, context: &LoginContext) -> Vec<(SubjectKey, u32)> {
        let mut out = Vec::with_capacity(2);
        if self.settings.network_spray_accounts > 0 {
            out.push((
                SubjectKey::ip_network(&context.ip),
                self.settings.network_spray_accounts,
            ));
        }
        if self.settings.asn_spray_accounts > 0
            && let Some(asn) = self.scoring.asn_of(context.ip.addr())
        {
            out.push((SubjectKey::asn(asn), self.settings.asn_spray_accounts));
        }
        out
    }

    /// The window of distinct accounts that logged in from a network or ASN (`SHARED`, in
    /// its value): recorded with `member`, counted without.
    fn network_successes(&self, key: String, member: Option<u64>, score: i64) -> Step {
        let shared = self.scoring.shared_ips().settings();
        Step {
            cap: NETWORK_CAP,
            window_ms: i64::try_from(shared.window_s.saturating_mul(1000)).unwrap_or(i64::MAX),
            ..self.step((key, SHARED.to_owned()), member, score)
        }
    }

    /// A failure-window step (count only without `member`).
    fn step(&self, (key, window): (String, String), member: Option<u64>, score: i64) -> Step {
        Step {
            key,
            window,
            member,
            score,
            window_ms: self.window_ms(),
            cap: velocity::WINDOW_CAP,
            gap: false,
            action: WindowAction::Record,
        }
    }

    /// Entries kept in a pair (account+IP, account+device) window: its count only matters
    /// up to the thresholds, and an account attacked from many IPs has one such window per
    /// IP (at most [`crate::store::MAX_WINDOWS_PER_KIND`] of each kind), so its value stays
    /// small. The account's own window keeps [`velocity::WINDOW_CAP`].
    fn pair_cap(&self) -> usize {
        let threshold = self
            .settings
            .lockout_after
            .max(self.settings.challenge_after);
        usize::try_from(threshold)
            .unwrap_or(velocity::WINDOW_CAP)
            .min(velocity::WINDOW_CAP)
    }

    /// Since when (Unix ms, at `now`) stored auth events still count in the hot store's
    /// windows: failures (the failure window), successes (the known contexts).
    pub fn replay_horizons(&self, now: i64) -> (i64, i64) {
        (
            now.saturating_sub(self.window_ms()),
            now.saturating_sub(self.known_ms()),
        )
    }

    fn known_ms(&self) -> i64 {
        i64::try_from(self.settings.known_for_days.saturating_mul(86_400_000)).unwrap_or(i64::MAX)
    }

    /// A step on the account's known IPs/devices.
    fn known_step(
        &self,
        account: &SubjectKey,
        member: &str,
        ts_ms: i64,
        action: WindowAction,
    ) -> Step {
        Step {
            key: self.keys.known(account),
            window: "k".to_owned(),
            member: Some(velocity::member_id(member)),
            score: ts_ms,
            window_ms: self.known_ms(),
            cap: velocity::KNOWN_CAP,
            gap: false,
            action,
        }
    }

    /// A failure's window operations: the account's windows (account, +IP, +device), then
    /// per source the distinct accounts failing from it (and, for an IP, its failures), then
    /// the account's quick-login window.
    ///
    /// Window membership is by time of receipt (`now`): a failure dated minutes back (a
    /// backlog in the auth service's queue) counts from when Palisade hears of it, and a
    /// date in the future gains nothing. The quick-login window alone keeps the claimed time
    /// (clamped to `now`): it compares failures with each other.
    fn failure_steps(&self, event: &LoginEvent<'_>, now: i64, steps: &mut Vec<Step>) {
        let id = velocity::member_id(event.event_id);
        let ts = now;
        for (i, window) in self.context_windows(event.context).into_iter().enumerate() {
            let mut step = self.step(window, Some(id), ts);
            if i > 0 {
                step.cap = self.pair_cap();
            }
            steps.push(step);
        }
        let account = Some(velocity::member_id(event.context.account.as_str()));
        let ip = self.keys.windows(&event.context.ip_key);
        steps.push(self.step((ip.clone(), "a".to_owned()), account, ts));
        steps.push(self.step((ip, "f".to_owned()), Some(id), ts));
        if let Some(device) = &event.context.device {
            steps.push(self.step((self.keys.windows(device), "a".to_owned()), account, ts));
        }
        // The source's network and ASN: distinct failing accounts, and (count only) the
        // distinct accounts that logged in from it.
        for (source, _) in self.networks(event.context) {
            let key = self.keys.windows(&source);
            steps.push(Step {
                cap: NETWORK_CAP,
                ..self.step((key.clone(), "a".to_owned()), account, ts)
            });
            steps.push(self.network_successes(key, None, ts));
        }
        steps.push(Step {
            cap: QUICK_CAP,
            ..self.step(
                (self.keys.windows(&event.context.account), QUICK.to_owned()),
                Some(id),
                event.ts_ms.min(now),
            )
        });
    }

    /// The event's IP, network and device become known to the account (the lockout-DoS
    /// rule; a success and a passed challenge).
    fn known_steps(&self, event: &LoginEvent<'_>, now: i64, steps: &mut Vec<Step>) {
        let context = event.context;
        let at = event.ts_ms.min(now);
        let ip = context.ip_key.to_string();
        steps.push(self.known_step(&context.account, &ip, at, WindowAction::Record));
        let network = context.ip.network_text();
        steps.push(self.known_step(&context.account, &network, at, WindowAction::Record));
        if let Some(device) = &context.device {
            let device = device.to_string();
            steps.push(self.known_step(&context.account, &device, at, WindowAction::Record));
        }
    }

    /// A success's operations: its IP and device become known to the account (the
    /// lockout-DoS rule), and the account+IP / account+device failure windows are cleared.
    fn success_steps(&self, event: &LoginEvent<'_>, now: i64, steps: &mut Vec<Step>) {
        let context = event.context;
        let at = event.ts_ms.min(now);
        self.known_steps(event, now, steps);
        for window in self.context_windows(context).into_iter().skip(1) {
            steps.push(Step {
                action: WindowAction::Delete,
                ..self.step(window, None, 0)
            });
        }
        let account = Some(velocity::member_id(context.account.as_str()));
        for (source, _) in self.networks(context) {
            steps.push(self.network_successes(self.keys.windows(&source), account, at));
        }
        // Last: the distinct accounts logging in from the IP (`limits.shared_ip`).
        let shared = self.scoring.shared_ips().settings();
        if shared.enabled {
            let account = Some(velocity::member_id(context.account.as_str()));
            steps.push(Step {
                window_ms: i64::try_from(shared.window_s.saturating_mul(1000)).unwrap_or(i64::MAX),
                cap: usize::try_from(shared.min_accounts).unwrap_or(velocity::WINDOW_CAP),
                ..self.step(
                    (self.keys.windows(&context.ip_key), SHARED.to_owned()),
                    account,
                    at,
                )
            });
        }
    }
}
