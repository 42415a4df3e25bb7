//! Storing lockouts: exactly one instance wins an account's lock marker and stores the
//! lockout (a batch's together, in one transaction), then announces it (marker stored,
//! factor, decision change, alert); a marker whose instance died first is adopted.

use super::{Error, Lockout, Lockouts, LoginContext, SIGNAL, policy, store, velocity};
use crate::model::SubjectKey;
use crate::scoring::{DecisionChange, Factor};

use futures_util::StreamExt;

pub(super) const PERMANENT_MS: i64 = 100 * 365 * 86_400_000;

/// How long a lock marker may wait for its lockout's row before another instance takes it
/// for an orphan (its instance stopped between the two) and stores the lockout itself.
/// (Between the two an instance runs two SQL statements: milliseconds, seconds at worst.)
pub(super) const ORPHAN_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// True when the lockout id of an unstored marker was made `ORPHAN_AFTER` ago or more at
/// `now_ms` (ids are ULIDs from the clock, which hold the time they were made); an id that
/// is not a ULID is taken as old.
pub(super) fn may_be_orphan(lockout_id: &str, now_ms: i64) -> bool {
    ulid::Ulid::from_string(lockout_id).map_or(true, |id| {
        let made_ms = i64::try_from(id.timestamp_ms()).unwrap_or(i64::MAX);
        now_ms.saturating_sub(made_ms) >= i64::try_from(ORPHAN_AFTER.as_millis()).unwrap_or(0)
    })
}

/// A lockout alert to raise: kind, subject, message, details.
pub(super) type LockAlert<'c> = (&'static str, &'c SubjectKey, String, serde_json::Value);

/// Subjects whose consequences run at the same time (each is a few hot-store round trips,
/// a lock also a few SQL statements on the pool).
/// Per account of a batch, its lock marker as read with the batch's windows: None if it had
/// none, else whether its lockout was stored. An account not in it was not read.
pub(super) type ReadMarkers<'a> = std::collections::HashMap<&'a SubjectKey, Option<bool>>;

pub(super) const LANES_AT_ONCE: usize = 8;

/// Runs `run` on every item, at most [`LANES_AT_ONCE`] at a time, each future made when it
/// starts (made up front for a batch that tipped 500 accounts over a threshold, they took
/// megabytes at once). After an error no more start; the ones running finish. Returns the
/// answers of those that succeeded and the first error.
pub(super) async fn at_most_lanes<T, R, Fut>(
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
    /// Locks the accounts (each with the failures that asked for it): per account the marker
    /// decides (exactly one instance stores a lockout), then every new lockout of the call is
    /// stored in one transaction, then each is announced (marker stored, factor, decision
    /// change, alert). One transaction for the batch, not one per lockout: a batch that locks
    /// many accounts pays one commit (what is left per account are the round trips of the
    /// marker and of the announcement).
    pub(super) async fn lock_all(
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
    pub(super) async fn prepare_locks<'c>(
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
    pub(super) async fn announce_locks<'c>(
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
            let shown = self.scoring.pseudonyms().shown(&context.account_name);
            tracing::info!(
                lockout.id = %id, account.id = %shown, lockout.level = level,
                "locked account {shown} for {} s (level {level})", duration_ms / 1000
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
}
