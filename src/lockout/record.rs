//! Recording login events: every window operation of a batch in one hot-store call, then
//! each failure's consequences (a challenge factor, an IP failing often, spraying, a lock),
//! a subject's in order as if recorded one by one.

use super::velocity::{Step, WindowAction, WindowCounts};

use super::{
    AccountStatus, Error, Lockouts, LoginContext, LoginEvent, Recorded, SIGNAL, policy, velocity,
};
use crate::model::SubjectKey;
use crate::scoring::Factor;

use std::collections::HashSet;

use super::locks::{ReadMarkers, at_most_lanes};

/// Per account of `events`, the smallest gap between the claimed times (clamped to `now`)
/// of its failures in the batch, when it has two or more.
pub(super) fn batch_gaps<'a>(
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
pub(super) enum Consequence<'a> {
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

impl Lockouts {
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
            step_up: false,
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

    /// Runs the events' window operations (one hot-store call) and their consequences.
    pub(super) async fn record(&self, events: &[LoginEvent<'_>]) -> Result<(), Error> {
        let now = self.clock.now_ms();
        let (steps, spans) = self.event_steps(events, &[], now);
        let counts = velocity::run_sequence(&self.hot, &steps, now).await?;
        self.consequences(events, &spans, &counts, &ReadMarkers::new(), now)
            .await?;
        Ok(())
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
            step_up: false,
        }])
        .await
    }

    /// What a recorded failure leads to, from its windows' counts (in `failure_steps` order),
    /// each with the subject it acts on. Pure: [`Lockouts::consequences`] runs them.
    pub(super) fn plan_failure<'a>(
        &self,
        context: &'a LoginContext,
        counts: &[(u32, Option<i64>)],
        out: &mut Vec<(&'a SubjectKey, Consequence<'a>)>,
        networks: &mut Vec<(SubjectKey, u32)>,
        suspects: &mut Vec<SubjectKey>,
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
        // A shared address's many users fail too: it takes more evidence there.
        let factor = if self.scoring.shared_ips().is_shared(&context.ip) {
            self.scoring.shared_ips().settings().spray_factor
        } else {
            1
        };
        let distinct = count(first_source);
        if distinct >= self.spray_threshold(context) {
            out.push((ip, Consequence::Spraying { distinct }));
        }
        let failures = count(first_source + 1);
        let threshold = self.settings.ip_failures.saturating_mul(factor);
        if failures >= threshold && (failures - threshold).is_multiple_of(threshold) {
            out.push((ip, Consequence::IpFailures { failures }));
        }
        if let Some(device) = &context.device {
            let distinct = count(first_source + 2);
            if distinct >= self.settings.spray_accounts {
                out.push((device, Consequence::Spraying { distinct }));
            }
        }
        // Rotating addresses: more accounts failing from the network (ASN) than logging in
        // from it, and at least its threshold. A carrier's busy network has more successes.
        let mut at = first_source + 2 + usize::from(context.device.is_some());
        for (source, threshold) in self.networks(context) {
            let (distinct, successes) = (count(at), count(at + 1));
            if distinct >= threshold && distinct > successes {
                networks.push((source, distinct));
            } else if self.settings.suspect_accounts > 0
                && distinct >= self.settings.suspect_accounts
                && distinct > successes
            {
                suspects.push(source);
            }
            at += 2;
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
    pub(super) async fn consequences<'a>(
        &self,
        events: &[LoginEvent<'a>],
        spans: &[std::ops::Range<usize>],
        counts: &[(u32, Option<i64>)],
        markers: &ReadMarkers<'_>,
        now: i64,
    ) -> Result<HashSet<&'a SubjectKey>, Error> {
        let mut planned = Vec::new();
        let mut networks: Vec<(SubjectKey, u32)> = Vec::new();
        let mut suspects: Vec<SubjectKey> = Vec::new();
        let mut shared: Vec<&SubjectKey> = Vec::new();
        let shared_ips = self.scoring.shared_ips();
        let min_accounts = shared_ips.settings().min_accounts;
        let guard = self.scoring.login_guard();
        let horizon = now.saturating_sub(guard.window_ms());
        let counted: Vec<&LoginEvent<'_>> = events
            .iter()
            .filter(|e| e.ts_ms >= horizon && !e.step_up)
            .collect();
        let failing: Vec<&LoginContext> = counted
            .iter()
            .filter(|e| e.failure)
            .map(|e| e.context)
            .collect();
        let successes = (counted.len() - failing.len()) as u64;
        // Failures from contexts their accounts know (one's own phone, after a success of
        // this batch too) are mistypes, not stuffing: the guard judges the others.
        let known = if failing.is_empty() || !guard.enabled() {
            0
        } else {
            self.known(&self.hot, &failing, now)
                .await?
                .into_iter()
                .filter(|k| *k)
                .count() as u64
        };
        guard.count(failing.len() as u64 - known, known, successes);
        for (event, span) in events.iter().zip(spans) {
            if event.failure {
                self.plan_failure(
                    event.context,
                    &counts[span.clone()],
                    &mut planned,
                    &mut networks,
                    &mut suspects,
                );
            } else if !event.step_up
                && shared_ips.settings().enabled
                && counts[span.clone()]
                    .last()
                    .is_some_and(|c| c.0 >= min_accounts)
                && !shared.contains(&&event.context.ip_key)
                && shared_ips.needs_mark(&event.context.ip_key, now)
            {
                shared.push(&event.context.ip_key);
            }
        }
        shared_ips.mark(&shared, now).await?;
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
        // A network's first spraying of the batch (each later one would find its alert).
        let mut seen = HashSet::new();
        networks.retain(|(source, _)| seen.insert(source.clone()));
        let (_, failed) = at_most_lanes(networks, |(source, distinct)| async move {
            self.spraying(&source, distinct, now).await
        })
        .await;
        if let Some(err) = failed {
            return Err(err);
        }
        self.suspect(suspects, now).await?;
        self.lock_all(&locks, markers, now).await?;
        Ok(locking)
    }

    /// The factor a challenge or an IP's failures assert (None for the other consequences,
    /// which do more than assert a factor).
    pub(super) fn factor(&self, consequence: Consequence<'_>, now: i64) -> Option<Factor> {
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
}
