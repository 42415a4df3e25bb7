//! Replaying stored auth events into the hot store's windows, after the hot store lost its
//! data (`crate::recovery`).

use super::{AuthEvent, Error, Ingest, Limits, store};
use crate::lockout::LoginEvent;
use crate::model::Identifiers;

impl Ingest {
    /// Replays the stored auth events into the hot store's windows (it lost its data): the
    /// failures of the last window (but those before their account's release) and the successes
    /// of the last `known_for_days`, oldest first, window operations only (nothing is decided again: the lockouts and factors they
    /// led to are restored from their own rows). The windows count by event id, so an event
    /// recorded meanwhile counts once. Returns how many events.
    pub async fn replay_windows(&self, ipv6_prefix_len: u8) -> Result<u64, Error> {
        const PAGE: u32 = 2000;
        let now = self.clock.now_ms();
        let (failures_since, successes_since) = self.lockouts.replay_horizons(now);
        let limits = Limits {
            ids: Identifiers {
                accounts: crate::model::AccountIds::Exact,
                max_len: usize::MAX,
            },
            ipv6_prefix_len,
        };
        let released = self.lockouts.released_since(failures_since).await?;
        let (mut ts, mut id) = (i64::MIN, String::new());
        let mut replayed = 0u64;
        loop {
            let page = store::replay_page(
                &self.durable,
                successes_since,
                failures_since,
                (ts, &id),
                PAGE,
            )
            .await?;
            let Some(last) = page.last() else {
                return Ok(replayed);
            };
            (ts, id) = (last.ts, last.event_id.clone());
            // A failure before its account's release no longer counts (a release clears
            // the account's windows).
            let events: Vec<AuthEvent> = page
                .iter()
                .filter(|e| {
                    e.kind != "login_failure"
                        || released.get(&e.account).is_none_or(|&at| e.ts > at)
                })
                .filter_map(|e| e.as_event(limits))
                .collect();
            let login: Vec<LoginEvent<'_>> = events.iter().map(AuthEvent::login_event).collect();
            self.lockouts.record_windows(&login, &[]).await?;
            replayed += login.len() as u64;
            if page.len() < PAGE as usize {
                return Ok(replayed);
            }
        }
    }
}
