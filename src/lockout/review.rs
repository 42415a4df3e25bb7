//! Lockouts as analysts see them: listing, one lockout with its events, release.

use super::*;

impl Lockouts {
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
