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

pub mod policy;
mod store;
pub mod velocity;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

pub use policy::{Action, Reason};

use crate::audit::{Actor, Audit};
use crate::clock::Clock;
use crate::config::LockoutSettings;
use crate::model::{ClientIp, SubjectKey};
use crate::scoring::{DecisionChange, Engine, Factor};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Not released and not yet expired.
    Active,
    /// Released by an analyst.
    Released,
    /// Ran out by themselves.
    Expired,
    /// Every lockout.
    All,
}

/// A filter and page position for [`Lockouts::list`].
#[derive(Debug, Clone)]
pub struct Query {
    /// Status filter.
    pub status: Status,
    /// Only this account.
    pub account: Option<String>,
    /// Only lockouts created at or after this Unix ms.
    pub since_ms: Option<i64>,
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
    /// A failure (else a success).
    pub failure: bool,
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
    /// Attested devices count as known contexts (wired by `app`).
    attested: std::sync::OnceLock<Arc<dyn AttestedDevices>>,
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

const PERMANENT_MS: i64 = 100 * 365 * 86_400_000;

/// How long a lock marker may wait for its lockout's row before another instance takes it
/// for an orphan (its instance stopped between the two) and stores the lockout itself.
/// (Between the two an instance runs two SQL statements: milliseconds, seconds at worst.)
const ORPHAN_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// True when the lockout id of an unstored marker was made `ORPHAN_AFTER` ago or more at
/// `now_ms` (ids are ULIDs from the clock, which hold the time they were made); an id that
/// is not a ULID is taken as old.
fn may_be_orphan(lockout_id: &str, now_ms: i64) -> bool {
    ulid::Ulid::from_string(lockout_id).map_or(true, |id| {
        let made_ms = i64::try_from(id.timestamp_ms()).unwrap_or(i64::MAX);
        now_ms.saturating_sub(made_ms) >= i64::try_from(ORPHAN_AFTER.as_millis()).unwrap_or(0)
    })
}

/// Name of the velocity signal in factors and reasons.
pub const SIGNAL: &str = "velocity";

/// The quick-login window in an account's value: its failures by claimed time (clamped to
/// the time of receipt), for comparing failures with their neighbours in time.
const QUICK: &str = "q";

/// Failures kept in the quick-login window: its smallest gap is all that is read of it.
const QUICK_CAP: usize = 16;

/// Per account of `events`, the smallest gap between the claimed times (clamped to `now`)
/// of its failures in the batch, when it has two or more.
fn batch_gaps<'a>(
    events: &[LoginEvent<'a>],
    now: i64,
) -> std::collections::HashMap<&'a SubjectKey, i64> {
    let mut times: std::collections::HashMap<&SubjectKey, Vec<i64>> = Default::default();
    for event in events.iter().filter(|e| e.failure) {
        times
            .entry(&event.context.account)
            .or_default()
            .push(event.ts_ms.min(now));
    }
    times
        .into_iter()
        .filter_map(|(account, mut ts)| {
            ts.sort_unstable();
            let gap = ts.windows(2).map(|pair| pair[1] - pair[0]).min()?;
            Some((account, gap))
        })
        .collect()
}

/// What a failure leads to, besides its windows, on one subject (see
/// [`Lockouts::consequences`]).
#[derive(Debug, Clone, Copy)]
enum Consequence<'a> {
    /// The account's failures reached `challenge_after` (or again a multiple of it).
    Challenge { failures: u32 },
    /// The account's failures ask for a lockout.
    Lock {
        context: &'a LoginContext,
        failures: u32,
    },
    /// The IP's failures reached `ip_failures` (or again a multiple of it).
    IpFailures { failures: u32 },
    /// The source (IP or device) failed on `spray_accounts` accounts or more.
    Spraying { distinct: u32 },
}

/// Per account of a batch, its lock marker as read with the batch's windows: None if it had
/// none, else whether its lockout was stored. An account not in it was not read.
type ReadMarkers<'a> = std::collections::HashMap<&'a SubjectKey, Option<bool>>;

/// A lockout alert to raise: kind, subject, message, details.
type LockAlert<'c> = (&'static str, &'c SubjectKey, String, serde_json::Value);

/// Subjects whose consequences run at the same time (each is a few hot-store round trips,
/// a lock also a few SQL statements on the pool).
const LANES_AT_ONCE: usize = 8;

/// Runs `run` on every item, at most [`LANES_AT_ONCE`] at a time, each future made when it
/// starts (made up front for a batch that tipped 500 accounts over a threshold, they took
/// megabytes at once). After an error no more start; the ones running finish. Returns the
/// answers of those that succeeded and the first error.
async fn at_most_lanes<T, R, Fut>(
    items: impl IntoIterator<Item = T>,
    run: impl Fn(T) -> Fut,
) -> (Vec<R>, Option<Error>)
where
    Fut: std::future::Future<Output = Result<R, Error>>,
{
    let mut waiting = items.into_iter();
    let mut running: futures_util::stream::FuturesUnordered<Fut> =
        waiting.by_ref().take(LANES_AT_ONCE).map(&run).collect();
    let (mut done, mut failed) = (Vec::new(), None);
    while let Some(result) = running.next().await {
        match result {
            Ok(answer) => done.push(answer),
            Err(err) => {
                failed.get_or_insert(err);
            }
        }
        if failed.is_none()
            && let Some(item) = waiting.next()
        {
            running.push(run(item));
        }
    }
    (done, failed)
}

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
            attested: std::sync::OnceLock::new(),
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

    /// Records a failed login (idempotent by `event_id`); locks the account when its
    /// failures reach `lockout_after`, and blocks spraying IPs/devices on the auth class.
    pub async fn record_failure(
        &self,
        context: &LoginContext,
        event_id: &str,
        ts_ms: i64,
    ) -> Result<(), Error> {
        self.record_events(&[LoginEvent {
            context,
            event_id,
            ts_ms,
            failure: true,
        }])
        .await
    }

    /// Records login events in order: every window operation of the whole batch in one
    /// hot-store call (one script on a single Redis), then each failure's consequences
    /// (challenge factor, spraying, lockout): a subject's in order, as if recorded one by one
    /// ([`Lockouts::consequences`]).
    pub async fn record_events(&self, events: &[LoginEvent<'_>]) -> Result<(), Error> {
        self.record(events).await
    }

    /// The first half of [`Lockouts::record_events`] with statuses: every window operation
    /// of `events` (one hot-store call) and, at the same time, the lock markers of the
    /// accounts of the events named in `latest` (indexes into `events`: an ingest batch's
    /// latest event per account). Nothing is decided yet: the caller may store the events
    /// meanwhile (the windows count by event id, so a batch retried after a failed store
    /// counts nothing twice) and then calls [`Lockouts::settle`].
    pub async fn record_windows(
        &self,
        events: &[LoginEvent<'_>],
        latest: &[usize],
    ) -> Result<Recorded, Error> {
        let now = self.clock.now_ms();
        let (steps, spans) = self.event_steps(events, latest, now);
        let accounts: Vec<&SubjectKey> =
            latest.iter().map(|&i| &events[i].context.account).collect();
        let (counts, locks) = tokio::try_join!(
            velocity::run_sequence(&self.hot, &steps, now),
            velocity::locks(&self.hot, &self.keys, &accounts, now),
        )?;
        Ok(Recorded {
            counts,
            spans,
            locks,
            now,
        })
    }

    /// The second half: each failure's consequences (challenge factor, spraying, lockout),
    /// a subject's in order as if recorded one by one, then the status of each event named in
    /// `latest`, as [`Lockouts::statuses`] would answer it right after. Takes the same
    /// `events` and `latest` as the [`Lockouts::record_windows`] call that made `recorded`.
    /// Lockouts need the events stored (a lockout lists them from the durable store).
    ///
    /// A failure's own window counts are its account's status windows (the recording
    /// returns them), so only the accounts whose latest event is a success are counted
    /// again; lock markers read with the windows are read again only for the accounts this
    /// batch's failures locked.
    pub async fn settle(
        &self,
        events: &[LoginEvent<'_>],
        latest: &[usize],
        recorded: Recorded,
    ) -> Result<Vec<AccountStatus>, Error> {
        let Recorded {
            counts,
            spans,
            mut locks,
            now,
        } = recorded;
        // Accounts whose lockout was stored when their windows were recorded: their failures
        // past the threshold lock nothing more (a lock would find that marker and stop), so
        // they skip the marker's round trip (a locked account's every later failure made one).
        // And those with no marker then need not read it again before setting one.
        let markers: ReadMarkers<'_> = latest
            .iter()
            .zip(&locks)
            .map(|(&i, lock)| {
                let stored = lock.as_ref().map(|m| m.stored);
                (&events[i].context.account, stored)
            })
            .collect();
        let locking = self
            .consequences(events, &spans, &counts, &markers, now)
            .await?;
        let relock: Vec<usize> = (0..latest.len())
            .filter(|&k| locking.contains(&events[latest[k]].context.account))
            .collect();
        if !relock.is_empty() {
            let accounts: Vec<&SubjectKey> = relock
                .iter()
                .map(|&k| &events[latest[k]].context.account)
                .collect();
            let fresh = velocity::locks(&self.hot, &self.keys, &accounts, now).await?;
            for (k, lock) in relock.into_iter().zip(fresh) {
                locks[k] = lock;
            }
        }
        let mut windows: Vec<Option<WindowCounts>> = latest
            .iter()
            .map(|&i| {
                let event = &events[i];
                // `failure_steps` begins with the context's windows, in `context_windows`
                // order, and ends with the quick-login window, whose gap the account's takes.
                let n = if event.context.device.is_some() { 3 } else { 2 };
                event.failure.then(|| {
                    let span = &counts[spans[i].clone()];
                    let mut windows = span[..n].to_vec();
                    windows[0].1 = span.last().and_then(|q| q.1);
                    windows
                })
            })
            .collect();
        let missing: Vec<usize> = (0..latest.len())
            .filter(|&k| windows[k].is_none())
            .collect();
        if !missing.is_empty() {
            let contexts: Vec<&LoginContext> =
                missing.iter().map(|&k| events[latest[k]].context).collect();
            for (k, counted) in missing
                .into_iter()
                .zip(self.count_windows(&self.hot, &contexts, now).await?)
            {
                windows[k] = Some(counted);
            }
        }
        // The batch's own failures compared with each other too: those dated before the
        // window (a backlog in the auth service) are not in the quick-login window.
        let batch_gaps = batch_gaps(events, now);
        for (k, &i) in latest.iter().enumerate() {
            if let (Some(counts), Some(&gap)) = (
                windows[k].as_mut(),
                batch_gaps.get(&events[i].context.account),
            ) {
                let first = &mut counts[0];
                first.1 = Some(first.1.map_or(gap, |g| g.min(gap)));
            }
        }
        let contexts: Vec<&LoginContext> = latest.iter().map(|&i| events[i].context).collect();
        let windows = windows.into_iter().map(Option::unwrap_or_default).collect();
        self.finish_statuses(&self.hot, &contexts, windows, locks, now)
            .await
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

    /// Runs the events' window operations (one hot-store call) and their consequences.
    async fn record(&self, events: &[LoginEvent<'_>]) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let (steps, spans) = self.event_steps(events, &[], now);
        let counts = velocity::run_sequence(&self.hot, &steps, now).await?;
        self.consequences(events, &spans, &counts, &ReadMarkers::new(), now)
            .await?;
        Ok(())
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
        steps.push(Step {
            cap: QUICK_CAP,
            ..self.step(
                (self.keys.windows(&event.context.account), QUICK.to_owned()),
                Some(id),
                event.ts_ms.min(now),
            )
        });
    }

    /// A success's operations: its IP and device become known to the account (the
    /// lockout-DoS rule), and the account+IP / account+device failure windows are cleared.
    fn success_steps(&self, event: &LoginEvent<'_>, now: i64, steps: &mut Vec<Step>) {
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
        for window in self.context_windows(context).into_iter().skip(1) {
            steps.push(Step {
                action: WindowAction::Delete,
                ..self.step(window, None, 0)
            });
        }
    }

    /// What a recorded failure leads to, from its windows' counts (in `failure_steps` order),
    /// each with the subject it acts on. Pure: [`Lockouts::consequences`] runs them.
    fn plan_failure<'a>(
        &self,
        context: &'a LoginContext,
        counts: &[(u32, Option<i64>)],
        out: &mut Vec<(&'a SubjectKey, Consequence<'a>)>,
    ) {
        let count = |i: usize| counts.get(i).map_or(0, |c| c.0);
        let account_failures = count(0);
        let challenge = self.settings.challenge_after;
        if account_failures >= challenge
            && (account_failures - challenge).is_multiple_of(challenge)
            && account_failures < self.settings.lockout_after
        {
            // Crossing (or again every `challenge_after` failures, to extend it).
            out.push((
                &context.account,
                Consequence::Challenge {
                    failures: account_failures,
                },
            ));
        }
        // After the account's windows (2, or 3 with a device): the IP's, then the device's.
        let first_source = if context.device.is_some() { 3 } else { 2 };
        let ip = &context.ip_key;
        let distinct = count(first_source);
        if distinct >= self.settings.spray_accounts {
            out.push((ip, Consequence::Spraying { distinct }));
        }
        let failures = count(first_source + 1);
        let threshold = self.settings.ip_failures;
        if failures >= threshold && (failures - threshold).is_multiple_of(threshold) {
            out.push((ip, Consequence::IpFailures { failures }));
        }
        if let Some(device) = &context.device {
            let distinct = count(first_source + 2);
            if distinct >= self.settings.spray_accounts {
                out.push((device, Consequence::Spraying { distinct }));
            }
        }
        // The lock alone (`policy::decide` would also word every reason, then dropped).
        if policy::locks(account_failures, &self.settings) {
            out.push((
                &context.account,
                Consequence::Lock {
                    context,
                    failures: account_failures,
                },
            ));
        }
    }

    /// Runs the consequences of the failures among `events` (each event's window counts in
    /// `counts[spans[i]]`); returns the accounts whose failures asked for a lockout (whether
    /// this call or another instance stored it).
    ///
    /// The consequences on one subject run in the events' order, one after another; those on
    /// different subjects touch different stored factors, alerts and markers, so they run at
    /// the same time (a batch that tipped 300 accounts over a threshold waited for 300 × 2
    /// round trips in a row: most of an ingest batch's time once accounts failed again).
    /// Only a subject's first lock and first spraying block of a batch run: each later one
    /// would find the marker the first set or found, and do nothing.
    async fn consequences<'a>(
        &self,
        events: &[LoginEvent<'a>],
        spans: &[std::ops::Range<usize>],
        counts: &[(u32, Option<i64>)],
        markers: &ReadMarkers<'_>,
        now: i64,
    ) -> Result<HashSet<&'a SubjectKey>, Error> {
        let mut planned = Vec::new();
        for (event, span) in events.iter().zip(spans) {
            if event.failure {
                self.plan_failure(event.context, &counts[span.clone()], &mut planned);
            }
        }
        let mut locking = HashSet::new();
        // Each account's first lock of the batch; they run together after the lanes (a lock
        // is an account's last consequence in a batch: no challenge at or past the lockout
        // threshold), their lockouts stored in one transaction.
        let mut locks: Vec<(&LoginContext, u32)> = Vec::new();
        let mut lanes: Vec<(&SubjectKey, Vec<Consequence<'_>>)> = Vec::new();
        let mut lane_of: std::collections::HashMap<&SubjectKey, usize> =
            std::collections::HashMap::new();
        for (subject, consequence) in planned {
            if let Consequence::Lock { context, failures } = consequence {
                let stored = markers.get(subject) == Some(&Some(true));
                if !stored && locking.insert(subject) {
                    locks.push((context, failures));
                }
                continue;
            }
            let lane = *lane_of.entry(subject).or_insert_with(|| {
                lanes.push((subject, Vec::new()));
                lanes.len() - 1
            });
            let queued = &mut lanes[lane].1;
            let again = matches!(consequence, Consequence::Spraying { .. })
                && queued
                    .iter()
                    .any(|c| matches!(c, Consequence::Spraying { .. }));
            if !again {
                queued.push(consequence);
            }
        }
        // In rounds: every subject's first consequence, then every second one, and so on, so
        // a subject's run in order. A round's factors (challenges, IPs failing often) go to
        // scoring together, a few calls in all (a batch of challenges took two round trips
        // each, and those were most of the service's and Redis's time in a wave of them); its
        // spraying checks run at most LANES_AT_ONCE at a time.
        for round in 0.. {
            let mut asserts = Vec::new();
            let mut spraying = Vec::new();
            for (subject, queued) in &lanes {
                match queued.get(round) {
                    Some(&Consequence::Spraying { distinct }) => {
                        spraying.push((*subject, distinct));
                    }
                    Some(&consequence) => {
                        if let Some(factor) = self.factor(consequence, now) {
                            asserts.push((*subject, factor));
                        }
                    }
                    None => {}
                }
            }
            if asserts.is_empty() && spraying.is_empty() {
                break;
            }
            let (asserted, (_, failed)) = tokio::join!(
                self.scoring.assert_many(asserts),
                at_most_lanes(spraying, |(subject, distinct)| self
                    .spraying(subject, distinct, now)),
            );
            asserted?;
            if let Some(err) = failed {
                return Err(err);
            }
        }
        self.lock_all(&locks, markers, now).await?;
        Ok(locking)
    }

    /// The factor a challenge or an IP's failures assert (None for the other consequences,
    /// which do more than assert a factor).
    fn factor(&self, consequence: Consequence<'_>, now: i64) -> Option<Factor> {
        let window_s = self.settings.window_s;
        let (code, message) = match consequence {
            Consequence::Lock { .. } | Consequence::Spraying { .. } => return None,
            Consequence::Challenge { failures } => (
                "login_failures",
                format!("{failures} failed logins in {} min", window_s / 60),
            ),
            Consequence::IpFailures { failures } => (
                "ip_failures",
                format!(
                    "{failures} failed logins from this IP in {} min",
                    window_s / 60
                ),
            ),
        };
        Some(
            Factor::scale(SIGNAL, code, self.settings.failure_factor, message)
                .on_classes(&["auth"])
                .until(now + self.window_ms()),
        )
    }

    /// A source failing on many accounts: multiplier 0 on `auth` for `spray_block_s`, and one
    /// alert per block period (the alert's marker decides, across instances).
    async fn spraying(&self, source: &SubjectKey, distinct: u32, now: i64) -> Result<(), Error> {
        let block = Duration::from_secs(self.settings.spray_block_s);
        let message = format!(
            "{source} failed logins on {distinct} accounts in {} min (password spraying)",
            self.settings.window_s / 60
        );
        let alert = self
            .scoring
            .alerts()
            .raise(
                "spraying",
                source,
                message.clone(),
                serde_json::json!({ "distinct_accounts": distinct, "block_s": self.settings.spray_block_s }),
                Some(block),
            )
            .await?;
        let Some(alert) = alert else {
            return Ok(());
        };
        let until = now + i64::try_from(block.as_millis()).unwrap_or(i64::MAX);
        self.scoring
            .assert(
                source,
                Factor::scale(SIGNAL, "spraying", 0.0, message)
                    .on_classes(&["auth"])
                    .until(until)
                    .referring_to(alert.id),
            )
            .await?;
        tracing::info!(subject.key = %source, "spraying: {source} failed on many accounts; auth multiplier 0");
        Ok(())
    }

    /// Locks the accounts (each with the failures that asked for it): per account the marker
    /// decides (exactly one instance stores a lockout), then every new lockout of the call is
    /// stored in one transaction, then each is announced (marker stored, factor, decision
    /// change, alert). One transaction where each lockout had its own: a bench batch that
    /// locked 500 accounts took 2.1-2.3 s in its consequences before, 1.2-1.6 s so (the rest
    /// is the per-account round trips of both halves).
    async fn lock_all(
        &self,
        locks: &[(&LoginContext, u32)],
        markers: &ReadMarkers<'_>,
        now: i64,
    ) -> Result<(), Error> {
        let (prepared, failed) = self.prepare_locks(locks, markers, now).await;
        let stored = match failed {
            Some(err) => Err(err),
            None => {
                let rows: Vec<(&Lockout, &[String])> = prepared
                    .iter()
                    .map(|(_, lockout, events)| (lockout, &events[..]))
                    .collect();
                store::insert_all(&self.durable, &rows)
                    .await
                    .map_err(Error::from)
            }
        };
        if let Err(err) = stored {
            // Markers set (or adopted) for lockouts not stored go, as one failed lock did.
            for (context, lockout, _) in &prepared {
                velocity::unlock(&self.hot, &self.keys, &context.account, &lockout.id, now).await?;
            }
            return Err(err);
        }
        let (alerts, failed) = self.announce_locks(&prepared).await;
        // The announced lockouts' alerts in one statement, even when another announcement
        // failed (the batch then fails; its retry finds these lockouts stored).
        self.scoring.alerts().raise_all(alerts).await?;
        failed.map_or(Ok(()), Err)
    }

    /// The first half of a batch's locks: an account is left out when another instance holds
    /// (or stored) its lockout; for the others the marker is this call's and the lockout,
    /// with the failures in its window, is ready to store. Markers are read (only where the
    /// batch's own read found one, or made none) and set per account, 8 at a time; levels
    /// and events are one query each for the whole batch.
    /// Returns those prepared and the first error (the caller then removes their markers).
    async fn prepare_locks<'c>(
        &self,
        locks: &[(&'c LoginContext, u32)],
        markers: &ReadMarkers<'_>,
        now: i64,
    ) -> (Vec<(&'c LoginContext, Lockout, Vec<String>)>, Option<Error>) {
        // A marker whose lockout is not known to be stored may be an orphan: the instance
        // that set it died before writing the row. Once older than `ORPHAN_AFTER`, the
        // lockout is stored under the marker's id (a duplicate write of a merely slow writer
        // is one row: same id); a younger one is being stored by the instance that set it
        // (taking it over then gave one lockout several alerts, each with its own level).
        let (candidates, failed) = at_most_lanes(locks, |&(context, failures)| async move {
            if markers.get(&context.account) == Some(&None) {
                // No marker when the batch's windows were recorded: nothing to adopt (an
                // orphan is old), and one set since makes `lock_if_absent` below refuse.
                return Ok(Some((context, failures, None)));
            }
            let adopted = match velocity::lock_marker(&self.hot, &self.keys, &context.account, now)
                .await?
            {
                Some(velocity::Marker { stored: true, .. }) => return Ok(None),
                Some(marker) if !may_be_orphan(&marker.lockout_id, now) => return Ok(None),
                Some(velocity::Marker {
                    lockout_id: id,
                    ttl_ms,
                    ..
                }) => {
                    if store::exists(&self.durable, &id).await? {
                        velocity::mark_stored(&self.hot, &self.keys, &context.account, &id)
                            .await?;
                        return Ok(None);
                    }
                    tracing::warn!(lockout.id = %id, "lock marker without a stored lockout (its instance stopped): storing it");
                    Some((id, ttl_ms))
                }
                None => None,
            };
            Ok(Some((context, failures, adopted)))
        })
        .await;
        let candidates: Vec<_> = candidates.into_iter().flatten().collect();
        if failed.is_some() || candidates.is_empty() {
            return (Vec::new(), failed);
        }
        let decay_ms =
            i64::try_from(self.settings.decay_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let names: Vec<&str> = candidates
            .iter()
            .map(|(context, ..)| context.account_name.as_str())
            .collect();
        let levels = match store::recent_counts(&self.durable, &names, now - decay_ms).await {
            Ok(levels) => levels,
            Err(err) => return (Vec::new(), Some(err.into())),
        };
        // Exactly one instance wins each marker and writes the lockout.
        let (won, mut failed) = at_most_lanes(candidates, |(context, failures, adopted)| {
            let level = levels
                .get(context.account_name.as_str())
                .map_or(1, |n| n.saturating_add(1));
            async move {
                let (id, duration_ms) = match adopted {
                    Some(marker) => marker,
                    None => {
                        let duration_ms = policy::lockout_seconds(level, &self.settings)
                            .map_or(PERMANENT_MS, |s| {
                                i64::try_from(s.saturating_mul(1000)).unwrap_or(PERMANENT_MS)
                            });
                        let id = self.clock.new_id().to_string();
                        if !velocity::lock_if_absent(
                            &self.hot,
                            &self.keys,
                            &context.account,
                            &id,
                            now,
                            duration_ms,
                        )
                        .await?
                        {
                            return Ok(None);
                        }
                        (id, duration_ms)
                    }
                };
                Ok(Some((context, failures, level, id, duration_ms)))
            }
        })
        .await;
        let won: Vec<_> = won.into_iter().flatten().collect();
        // The failures in each window, from the durable store (stored before their window
        // operations ran); the hot windows hold only 8-byte member ids.
        let mut events = Default::default();
        if failed.is_none() && !won.is_empty() {
            let names: Vec<&str> = won
                .iter()
                .map(|(context, ..)| context.account_name.as_str())
                .collect();
            let since = now - self.window_ms();
            match store::window_failures(&self.durable, &names, since, velocity::WINDOW_CAP).await {
                Ok(found) => events = found,
                Err(err) => failed = Some(err.into()),
            }
        }
        let prepared = won
            .into_iter()
            .map(|(context, failures, level, id, duration_ms)| {
                let lockout = Lockout {
                    id,
                    account: context.account_name.clone(),
                    scope: "account".to_owned(),
                    reason: "account_failures".to_owned(),
                    failures,
                    level,
                    created_at_ms: now,
                    locked_until_ms: now.saturating_add(duration_ms),
                    released_at_ms: None,
                    released_by: None,
                    release_reason: None,
                };
                let events = events.remove(&context.account_name).unwrap_or_default();
                (context, lockout, events)
            })
            .collect();
        (prepared, failed)
    }

    /// The second half of locks, once stored: each marker says so, each account's `auth`
    /// multiplier goes to 0, a decision change goes out. Markers all at once, factors in a
    /// few calls ([`crate::scoring::Engine::assert_many`]), the changes in one pipeline: a
    /// batch that locked 500 accounts made a few round trips per account, 8 accounts at a
    /// time. Returns the alerts to raise (the caller raises them together) of the lockouts
    /// announced, and the first error.
    async fn announce_locks<'c>(
        &self,
        prepared: &[(&'c LoginContext, Lockout, Vec<String>)],
    ) -> (Vec<LockAlert<'c>>, Option<Error>) {
        let marks = prepared.iter().map(|(context, lockout, _)| {
            velocity::mark_stored(&self.hot, &self.keys, &context.account, &lockout.id)
        });
        let mut failed = None;
        let mut marked = Vec::with_capacity(prepared.len());
        for ((context, lockout, _), outcome) in prepared
            .iter()
            .zip(futures_util::future::join_all(marks).await)
        {
            match outcome {
                Ok(()) => marked.push((*context, lockout)),
                Err(err) => {
                    failed.get_or_insert(Error::from(err));
                }
            }
        }
        let mut asserts = Vec::with_capacity(marked.len());
        let mut changes = Vec::with_capacity(marked.len());
        let mut alerts = Vec::with_capacity(marked.len());
        for (context, lockout) in marked {
            let (id, failures, level) = (&lockout.id, lockout.failures, lockout.level);
            let (now, until) = (lockout.created_at_ms, lockout.locked_until_ms);
            // What `prepare_locks` added to `now` (a marker without a TTL: `i64::MAX`,
            // saturated).
            let duration_ms = until - now;
            let message = format!(
                "locked after {failures} failed logins (level {level}) until {}",
                crate::clock::rfc3339(until)
            );
            let mut factor = Factor::scale(SIGNAL, "lockout", 0.0, message.clone())
                .on_classes(&["auth"])
                .referring_to(id.clone());
            if duration_ms < PERMANENT_MS {
                factor = factor.until(until);
            }
            asserts.push((&context.account, factor));
            changes.push(DecisionChange {
                cursor: String::new(),
                kind: "lockout".to_owned(),
                action: "set".to_owned(),
                subject: context.account.to_string(),
                classes: Default::default(),
                expires_at_ms: Some(until),
                // It binds strangers only: contexts the account knows get a challenge.
                reasons: vec![
                    "account_failures".to_owned(),
                    "known_contexts_exempt".to_owned(),
                ],
                reference: Some(id.clone()),
                list: None,
                at_ms: now,
            });
            tracing::info!(
                lockout.id = %id, account.id = %context.account_name, lockout.level = level,
                "locked account {} for {} s (level {level})", context.account_name, duration_ms / 1000
            );
            alerts.push((
                "lockout",
                &context.account,
                format!("{}: {message}", context.account_name),
                serde_json::json!({ "lockout_id": id, "failures": failures, "level": level, "locked_until_ms": until }),
            ));
        }
        let announced = async {
            self.scoring.assert_many(asserts).await?;
            self.scoring.record_changes(changes).await?;
            Ok::<_, Error>(())
        };
        match announced.await {
            Ok(()) => (alerts, failed),
            Err(err) => (Vec::new(), failed.or(Some(err))),
        }
    }

    /// Takes out of the windows what each event counted that its `original` (the stored event
    /// of the same id, if any) does not: an event refused as a conflict after the windows
    /// counted it. Only the windows counting event ids (an account's, its pairs', the
    /// quick-login window, an IP's failures): distinct-account counts and known contexts
    /// stay.
    pub async fn uncount(
        &self,
        events: &[(LoginEvent<'_>, Option<LoginEvent<'_>>)],
    ) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let mut steps = Vec::new();
        for (event, original) in events.iter().filter(|(e, _)| e.failure) {
            let member = velocity::member_id(event.event_id);
            let mut kept = Vec::new();
            if let Some(original) = original.filter(|o| o.failure) {
                self.failure_steps(&original, now, &mut kept);
            }
            let mut counted = Vec::new();
            self.failure_steps(event, now, &mut counted);
            steps.extend(
                counted
                    .into_iter()
                    .filter(|s| s.member == Some(member))
                    .filter(|s| !kept.iter().any(|k| k.key == s.key && k.window == s.window))
                    .map(|s| Step {
                        action: WindowAction::Remove,
                        ..s
                    }),
            );
        }
        velocity::run_sequence(&self.hot, &steps, now).await?;
        Ok(())
    }

    /// Records a successful login: its IP and device become known to the account (the
    /// lockout-DoS rule), and the account+IP / account+device failure windows are cleared.
    pub async fn record_success(&self, context: &LoginContext, ts_ms: i64) -> Result<(), Error> {
        self.record_events(&[LoginEvent {
            context,
            event_id: "",
            ts_ms,
            failure: false,
        }])
        .await
    }

    /// Per context: whether the account knows it (the lockout-DoS rule, the one place it is
    /// decided). A context is known when the account logged in successfully within
    /// `known_for_days` from its device, its IP, or its IP's network (the /24 of an IPv4
    /// address, the /64 of an IPv6 one: a household, a carrier's pool), or when its device
    /// holds a fresh attestation verdict (device integrity or better). One hot-store call
    /// for the windows of all of them.
    async fn known(
        &self,
        hot: &Hot,
        contexts: &[&LoginContext],
        now: i64,
    ) -> Result<Vec<bool>, Error> {
        let mut steps = Vec::new();
        let mut spans = Vec::with_capacity(contexts.len());
        for context in contexts {
            let start = steps.len();
            let members = [context.ip_key.to_string(), context.ip.network_text()]
                .into_iter()
                .chain(context.device.as_ref().map(ToString::to_string));
            for member in members {
                steps.push(self.known_step(&context.account, &member, now, WindowAction::Contains));
            }
            spans.push(start..steps.len());
        }
        let found = velocity::run_sequence(hot, &steps, now).await?;
        let mut known: Vec<bool> = spans
            .into_iter()
            .map(|span| found[span].iter().any(|(hit, _)| *hit > 0))
            .collect();
        if let Some(attested) = self.attested.get() {
            for (known, context) in known.iter_mut().zip(contexts) {
                if let (false, Some(device)) = (*known, &context.device) {
                    *known = attested.is_attested(device).await?;
                }
            }
        }
        Ok(known)
    }

    /// Installs the source of attestation verdicts (once; later calls are ignored).
    pub fn set_attested(&self, attested: Arc<dyn AttestedDevices>) {
        let _ = self.attested.set(attested);
    }

    /// The lockout-DoS rule at the limiter: when `context`'s account is locked and the
    /// account knows the context ([`Lockouts::status`] answers it a challenge), the
    /// multiplier the account has on `class` without its lockout; None when no lockout
    /// stands or the context is a stranger's (the lockout binds it).
    pub async fn exemption(
        &self,
        context: &LoginContext,
        class: &str,
    ) -> Result<Option<Exemption>, Error> {
        let now = self.clock.now_ms();
        let hot = &self.status_hot;
        let Some((lockout_id, _)) = velocity::lock(hot, &self.keys, &context.account, now).await?
        else {
            return Ok(None);
        };
        if !self.known(hot, &[context], now).await?[0] {
            return Ok(None);
        }
        let lockout = format!("{SIGNAL}:lockout");
        let multiplier = self
            .scoring
            .multiplier_without(&context.account, class, &[&lockout])
            .await?;
        Ok(Some(Exemption {
            multiplier,
            lockout_id,
        }))
    }

    /// What the auth service must do for a login attempt in this context, from the hot store
    /// only (no SQL per login).
    pub async fn status(&self, context: &LoginContext) -> Result<AccountStatus, Error> {
        let mut statuses = self.statuses(std::slice::from_ref(context)).await?;
        Ok(statuses.pop().expect("one status per context"))
    }

    /// [`Lockouts::status`] of many attempts at once: every window count in one hot-store
    /// call and every lock marker in one pipeline.
    pub async fn statuses(&self, contexts: &[LoginContext]) -> Result<Vec<AccountStatus>, Error> {
        let now = self.clock.now_ms();
        let contexts: Vec<&LoginContext> = contexts.iter().collect();
        let accounts: Vec<&SubjectKey> = contexts.iter().map(|c| &c.account).collect();
        let hot = &self.status_hot;
        let (windows, locks) = tokio::try_join!(self.count_windows(hot, &contexts, now), async {
            Ok::<_, Error>(velocity::locks(hot, &self.keys, &accounts, now).await?)
        },)?;
        self.finish_statuses(hot, &contexts, windows, locks, now)
            .await
    }

    /// Each context's status windows (account with its gap, +IP, +device), counted in one
    /// hot-store call.
    async fn count_windows(
        &self,
        hot: &Hot,
        contexts: &[&LoginContext],
        now: i64,
    ) -> Result<Vec<WindowCounts>, Error> {
        let mut steps = Vec::new();
        let mut spans = Vec::with_capacity(contexts.len());
        for context in contexts {
            let start = steps.len();
            for window in self.context_windows(context) {
                steps.push(self.step(window, None, 0));
            }
            steps.push(Step {
                gap: true,
                ..self.step(
                    (self.keys.windows(&context.account), QUICK.to_owned()),
                    None,
                    0,
                )
            });
            spans.push(start..steps.len());
        }
        let counts = velocity::run_sequence(hot, &steps, now).await?;
        // The account's window takes the quick-login window's gap (see `decide_status`).
        Ok(spans
            .into_iter()
            .map(|span| {
                let (quick, windows) = counts[span].split_last().expect("a quick-login step");
                let mut windows = windows.to_vec();
                windows[0].1 = quick.1;
                windows
            })
            .collect())
    }

    /// Statuses from each context's window counts and its lock marker.
    async fn finish_statuses(
        &self,
        hot: &Hot,
        contexts: &[&LoginContext],
        windows: Vec<WindowCounts>,
        locks: Vec<Option<velocity::Marker>>,
        now: i64,
    ) -> Result<Vec<AccountStatus>, Error> {
        // Known contexts matter only where a lock stands: one call for all locked ones.
        let locked: Vec<&LoginContext> = contexts
            .iter()
            .zip(&locks)
            .filter(|(_, lock)| lock.is_some())
            .map(|(context, _)| *context)
            .collect();
        let mut known = self.known(hot, &locked, now).await?.into_iter();
        Ok(windows
            .into_iter()
            .zip(locks)
            .map(|(counts, lock)| {
                let known = lock.is_some() && known.next().unwrap_or(false);
                let lock = lock.map(|m| (m.lockout_id, m.ttl_ms));
                self.decide_status(&counts, lock, known, now)
            })
            .collect())
    }

    /// The status from an account's window counts (account with its gap, +IP, +device), its
    /// lock marker and whether this IP/device logged in successfully before.
    fn decide_status(
        &self,
        counts: &[(u32, Option<i64>)],
        lock: Option<(String, i64)>,
        known: bool,
        now: i64,
    ) -> AccountStatus {
        let count = |i: usize| counts.get(i).map_or(0, |c| c.0);
        let newest_gap = counts.first().and_then(|c| c.1);
        let failures = count(0);
        if let Some((lockout_id, ttl_ms)) = lock {
            let locked_until = now.saturating_add(ttl_ms.min(PERMANENT_MS));
            if known {
                return AccountStatus {
                    action: Action::Challenge,
                    locked_until_ms: None,
                    lockout_id: Some(lockout_id),
                    failures_in_window: failures,
                    reasons: vec![Reason::new(
                        "known_context",
                        "the account is locked, but it knows this context (a recent login from this device, IP or network, or an attested device): challenge instead",
                    )],
                };
            }
            return AccountStatus {
                action: Action::Lockout,
                locked_until_ms: Some(locked_until),
                lockout_id: Some(lockout_id),
                failures_in_window: failures,
                reasons: vec![Reason::new(
                    "account_locked",
                    "the account is locked after repeated failures",
                )],
            };
        }
        // Any two failures closer than a human types, the same instant included (a script's
        // batch without timestamps, or one second-resolution timestamp for both).
        let too_fast = newest_gap.is_some_and(|gap| {
            gap >= 0 && gap < i64::try_from(self.settings.human_interval_ms).unwrap_or(0)
        });
        let (mut action, mut reasons) = policy::decide(
            policy::Counts {
                account: failures,
                pair_ip: count(1),
                pair_device: count(2),
                too_fast,
            },
            &self.settings,
        );
        // Only a lockout record (its hot marker) locks. Once it has expired or been released,
        // failures still in the window ask for a challenge until they age out.
        if action == Action::Lockout {
            action = Action::Challenge;
            reasons.push(Reason::new(
                "lockout_ended",
                "the last lockout has ended; failures are still in the window",
            ));
        }
        AccountStatus {
            action,
            locked_until_ms: None,
            lockout_id: None,
            failures_in_window: failures,
            reasons,
        }
    }

    /// Lockouts matching `query`, newest first, and the cursor of the next page.
    pub async fn list(&self, query: &Query) -> Result<(Vec<Lockout>, Option<String>), Error> {
        let limit = query.limit.clamp(1, 500);
        let mut items = store::list(&self.durable, query, self.clock.now_ms(), limit + 1).await?;
        let next = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|l| l.id.clone())
        } else {
            None
        };
        Ok((items, next))
    }

    /// One lockout with the failure events that caused it.
    pub async fn get(&self, id: &str) -> Result<(Lockout, Vec<LockoutEvent>), Error> {
        let lockout = store::get(&self.durable, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let events = store::events(&self.durable, id).await?;
        Ok((lockout, events))
    }

    /// Releases a lockout: at once on every instance (the hot marker, the account's failure
    /// window and its auth multiplier are cleared), audited as `lockout.release`.
    pub async fn release(
        &self,
        id: &str,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Lockout, Error> {
        let lockout = store::get(&self.durable, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let now = self.clock.now_ms();
        if lockout.released_at_ms.is_some()
            || !store::release(&self.durable, id, now, &actor.name, reason).await?
        {
            return Err(Error::AlreadyReleased(id.to_owned()));
        }
        // Account names were bounded when the lockout was made; a stored one always parses.
        if let Ok(account) = SubjectKey::user(&lockout.account, usize::MAX) {
            velocity::unlock(&self.hot, &self.keys, &account, id, now).await?;
            // Every failure window of the account (pairs included): one value.
            velocity::clear(&self.hot, &[self.keys.windows(&account)]).await?;
            self.scoring
                .retract(
                    &account,
                    &[
                        &format!("{SIGNAL}:lockout"),
                        &format!("{SIGNAL}:login_failures"),
                    ],
                )
                .await?;
            self.scoring
                .record_change(DecisionChange {
                    cursor: String::new(),
                    kind: "lockout".to_owned(),
                    action: "delete".to_owned(),
                    subject: account.to_string(),
                    classes: Default::default(),
                    expires_at_ms: None,
                    reasons: vec!["released".to_owned()],
                    reference: Some(id.to_owned()),
                    list: None,
                    at_ms: now,
                })
                .await?;
        }
        self.audit
            .record(
                actor,
                "lockout.release",
                id,
                serde_json::json!({ "account": lockout.account, "reason": reason }),
                request_id,
            )
            .await?;
        tracing::info!(lockout.id = %id, account.id = %lockout.account, "released lockout {id} for account {}", lockout.account);
        store::get(&self.durable, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_owned()))
    }
}
