//! What the auth service must do for a login attempt, and the lockout-DoS rule: whether an
//! account knows a context (a device, IP or network it logged in from, or an attested device)
//! decides between a lockout and a challenge, for `/status` and for the limiter.

use super::policy::{Action, Reason};
use super::velocity::{Step, WindowAction, WindowCounts};

use super::{
    AccountStatus, Error, Exemption, Lockouts, LoginContext, QUICK, SIGNAL, policy, velocity,
};
use crate::model::SubjectKey;
use crate::store::Hot;

use super::locks::PERMANENT_MS;
use crate::config::UnknownContext;

impl Lockouts {
    /// Per context: whether the account knows it (the lockout-DoS rule, the one place it is
    /// decided). A context is known when the account logged in successfully within
    /// `known_for_days` from its device, its IP, or its IP's network (the /24 of an IPv4
    /// address, the /64 of an IPv6 one: a household, a carrier's pool), or when its device
    /// holds a fresh attestation verdict (device integrity or better). One hot-store call
    /// for the windows of all of them.
    pub(super) async fn known(
        &self,
        hot: &Hot,
        contexts: &[&LoginContext],
        now: i64,
    ) -> Result<Vec<bool>, Error> {
        self.known_by(hot, contexts, now, true).await
    }

    /// [`Lockouts::known`], by the device alone when `by_address` is false.
    async fn known_by(
        &self,
        hot: &Hot,
        contexts: &[&LoginContext],
        now: i64,
        by_address: bool,
    ) -> Result<Vec<bool>, Error> {
        let mut steps = Vec::new();
        let mut spans = Vec::with_capacity(contexts.len());
        for context in contexts {
            let start = steps.len();
            let addresses = [context.ip_key.to_string(), context.ip.network_text()];
            let members = addresses
                .into_iter()
                .filter(|_| by_address)
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
        for (known, context) in known.iter_mut().zip(contexts) {
            if let (false, Some(device)) = (*known, &context.device) {
                *known = self.attested.is_attested(device).await?;
            }
        }
        Ok(known)
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

    /// True when the account knows the context: logged in from its IP, network or device
    /// before, or the device is attested (the lockout-DoS rule's test).
    pub async fn knows(&self, context: &LoginContext) -> Result<bool, Error> {
        let now = self.clock.now_ms();
        Ok(self.known(&self.status_hot, &[context], now).await?[0])
    }

    /// True when the account knows the context's device (a success from it within
    /// `known_for_days`) or the device is attested; the address does not count (behind a
    /// carrier NAT every customer shares it).
    pub async fn knows_device(&self, context: &LoginContext) -> Result<bool, Error> {
        if context.device.is_none() {
            return Ok(false);
        }
        let now = self.clock.now_ms();
        Ok(self
            .known_by(&self.status_hot, &[context], now, false)
            .await?[0])
    }

    /// What the auth service must do for a login attempt in this context, from the hot store
    /// only (no SQL per login). While the login guard is on or the context's network is
    /// blocked, an account not otherwise challenged gets the limit check's answer: a
    /// step-up (`known_context`, or `login_guard` / `network_blocked` for a context it does
    /// not know; the challenge id comes with the limit check), or under
    /// `lockout.unknown_context = "refuse"` a stranger's lockout.
    pub async fn status(&self, context: &LoginContext) -> Result<AccountStatus, Error> {
        let mut statuses = self.statuses(std::slice::from_ref(context)).await?;
        let mut status = statuses.pop().expect("one status per context");
        if status.action == Action::None
            && let Some(code) = self.scoring.logins_stopped(&context.ip)
        {
            let known = self.knows(context).await?;
            // A suspected network's own users pass as if nothing were suspected.
            if known && code == "network_spraying" {
                return Ok(status);
            }
            let (action, reason) = match (known, self.settings.unknown_context) {
                (true, _) => (
                    Action::Challenge,
                    Reason::new(
                        "known_context",
                        "logins are stopped from contexts their accounts do not know, but the account knows this one: challenge",
                    ),
                ),
                (false, UnknownContext::Challenge) => (
                    Action::Challenge,
                    Reason::new(
                        code,
                        "a context the account does not know, while logins are guarded: challenge, and report challenge_passed",
                    ),
                ),
                (false, UnknownContext::Refuse) => (
                    Action::Lockout,
                    Reason::new(
                        code,
                        "a context the account does not know, while logins are guarded: refuse",
                    ),
                ),
            };
            status.action = action;
            status.reasons.push(reason);
        }
        Ok(status)
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
    pub(super) async fn count_windows(
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
    pub(super) async fn finish_statuses(
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
    pub(super) fn decide_status(
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
}
