//! Login replay: stored auth events through the live and a candidate `[lockout]`.
//!
//! Each policy runs on a whole in-process instance of its own (SQLite in a temporary folder,
//! in-process windows, simulated time), so the real velocity and lockout code decides which
//! accounts either policy locks and which successful logins the candidate would have refused
//! first.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::app::App;
use crate::clock::{Clock, ManualClock};
use crate::config::{LockoutSettings, Settings};
use crate::ingest::{AuthKind, Limits, RawAuthEvent};
use crate::lockout::Action;
use crate::policy::logins::{LoginReport, StoredEvent};

struct Side {
    app: App,
    clock: ManualClock,
    _dir: tempfile::TempDir,
    locked: BTreeSet<String>,
    refused_successes: u64,
}

impl Side {
    async fn new(
        base: &Settings,
        lockout: &LockoutSettings,
        start_ms: i64,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("palisade-replay-")
            .tempdir()?;
        let mut settings = base.clone();
        settings.database_url = format!("sqlite://{}", dir.path().join("replay.db").display());
        settings.redis_url = None;
        settings.data_dir = dir.path().join("data");
        std::fs::create_dir_all(&settings.data_dir)?;
        settings.bootstrap_token = None;
        settings.record.enabled = false;
        settings.scoring.webhooks.clear();
        settings.lockout = lockout.clone();
        let clock = ManualClock::new(start_ms);
        let app = App::build_with_clock(settings, Arc::new(clock.clone())).await?;
        Ok(Self {
            app,
            clock,
            _dir: dir,
            locked: BTreeSet::new(),
            refused_successes: 0,
        })
    }

    async fn step(&mut self, event: &StoredEvent) -> anyhow::Result<()> {
        // A passed login challenge is not a login, and its challenge was never issued in
        // this replay's store: neither policy counts it.
        if event.kind == AuthKind::ChallengePassed.as_str() {
            return Ok(());
        }
        let now = self.clock.now_ms();
        if event.received_ms > now {
            let by = u64::try_from(event.received_ms - now).unwrap_or(0);
            self.clock.advance(Duration::from_millis(by));
        }
        let raw: RawAuthEvent = serde_json::from_value(serde_json::json!({
            "event_id": event.event_id,
            "type": event.kind,
            "account": event.account,
            "ip": event.ip,
            "device_id": event.device_id,
            "endpoint": event.endpoint,
            "ts": crate::clock::rfc3339(event.ts_ms),
        }))?;
        let limits = Limits {
            ids: self.app.settings.http.identifiers(),
            ipv6_prefix_len: self.app.settings.limits.ipv6_prefix_len,
        };
        let Ok(mut parsed) =
            crate::ingest::validate_auth_batch(vec![raw], self.clock.now_ms(), limits)
        else {
            // An event this policy's settings do not accept (an id too long) is skipped.
            return Ok(());
        };
        let Some(parsed_event) = parsed.pop() else {
            return Ok(());
        };
        if parsed_event.kind == AuthKind::LoginSuccess {
            let status = self.app.lockouts.status(&parsed_event.context).await?;
            if status.action == Action::Lockout {
                self.refused_successes += 1;
            }
        }
        let outcome = self.app.ingest.auth_events(vec![parsed_event]).await?;
        for (account, status) in outcome.decisions {
            if status.action == Action::Lockout {
                self.locked.insert(account);
            }
        }
        Ok(())
    }
}

/// Replays `events` (in the order given: by receipt) through `live` with its own
/// `[lockout]` and with `candidate`.
pub async fn replay(
    live: &Settings,
    candidate: &LockoutSettings,
    events: &[StoredEvent],
) -> anyhow::Result<LoginReport> {
    let Some(first) = events.first() else {
        return Ok(LoginReport::default());
    };
    let mut a = Side::new(live, &live.lockout, first.received_ms).await?;
    let mut b = Side::new(live, candidate, first.received_ms).await?;
    for event in events {
        a.step(event).await?;
        b.step(event).await?;
    }
    let name = |set: BTreeSet<&String>| set.into_iter().take(100).cloned().collect();
    Ok(LoginReport {
        events: events.len() as u64,
        locked_live: a.locked.len() as u64,
        locked_candidate: b.locked.len() as u64,
        newly_locked: name(b.locked.difference(&a.locked).collect()),
        no_longer_locked: name(a.locked.difference(&b.locked).collect()),
        successes_refused_live: a.refused_successes,
        successes_refused_candidate: b.refused_successes,
    })
}
