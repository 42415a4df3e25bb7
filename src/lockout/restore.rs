//! The hot side of lockouts put back from the durable store after the hot store lost its
//! data: the markers of the lockouts in force, and which failures no longer count.

use super::{Error, Lockout, Lockouts, store, velocity};
use crate::model::SubjectKey;

/// Lockouts read per page.
const PAGE: u32 = 1000;
/// Markers written at once.
const AT_ONCE: usize = 32;

impl Lockouts {
    /// Sets the lock marker of every lockout in force (each expiring when its lockout does),
    /// as stored; a marker already there stays. Returns how many lockouts are in force.
    pub async fn restore_markers(&self) -> Result<u64, Error> {
        let now = self.clock.now_ms();
        let mut after = String::new();
        let mut restored = 0u64;
        loop {
            let page = store::active_after(&self.durable, now, &after, PAGE).await?;
            let Some(last) = page.last() else {
                return Ok(restored);
            };
            after = last.id.clone();
            for chunk in page.chunks(AT_ONCE) {
                let writes = chunk
                    .iter()
                    .map(|lockout| self.restore_marker(lockout, now));
                for written in futures_util::future::join_all(writes).await {
                    written?;
                }
            }
            restored += page.len() as u64;
            if page.len() < PAGE as usize {
                return Ok(restored);
            }
        }
    }

    async fn restore_marker(&self, lockout: &Lockout, now: i64) -> Result<(), Error> {
        // Account names were bounded when the lockout was made.
        let Ok(account) = SubjectKey::user(&lockout.account, usize::MAX) else {
            return Ok(());
        };
        let ttl = lockout.locked_until_ms.saturating_sub(now).max(1);
        velocity::restore_marker(&self.hot, &self.keys, &account, &lockout.id, now, ttl).await?;
        Ok(())
    }

    /// Makes this hot store's side of `account`'s lockouts what the durable store says (a
    /// lockout made, extended or released in another region): the marker of the lockout in
    /// force, expiring when it does; none, and the account's failure windows cleared, when
    /// a stored lockout it still holds was released or has ended.
    pub async fn sync_account(&self, account: &str) -> Result<(), Error> {
        let Ok(subject) = SubjectKey::user(account, usize::MAX) else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        let marker = velocity::lock_marker(&self.hot, &self.keys, &subject, now).await?;
        match store::active_for(&self.durable, account, now).await? {
            Some(lockout) => {
                let ttl = lockout.locked_until_ms.saturating_sub(now).max(1);
                match marker {
                    Some(marker) if marker.lockout_id == lockout.id => {
                        velocity::retime(&self.hot, &self.keys, &subject, &lockout.id, now, ttl)
                            .await?;
                    }
                    // A marker not yet stored is a lockout this region is making: its
                    // maker finishes it.
                    Some(marker) if marker.stored => {
                        velocity::unlock(&self.hot, &self.keys, &subject, &marker.lockout_id, now)
                            .await?;
                        self.restore_marker(&lockout, now).await?;
                    }
                    Some(_) => {}
                    None => self.restore_marker(&lockout, now).await?,
                }
            }
            None => {
                if let Some(marker) = marker.filter(|m| m.stored) {
                    velocity::unlock(&self.hot, &self.keys, &subject, &marker.lockout_id, now)
                        .await?;
                    velocity::clear(&self.hot, &[self.keys.windows(&subject)]).await?;
                }
            }
        }
        Ok(())
    }

    /// Per account released since `since_ms`, when: its failures before then no longer count
    /// (a release clears the account's windows).
    pub async fn released_since(
        &self,
        since_ms: i64,
    ) -> Result<std::collections::HashMap<String, i64>, Error> {
        Ok(store::released_since(&self.durable, since_ms)
            .await?
            .into_iter()
            .collect())
    }
}
