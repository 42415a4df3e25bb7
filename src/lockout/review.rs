//! Lockouts as analysts see them: listing, one lockout with its events, release.

use super::{Error, Lockout, LockoutEvent, Lockouts, Query, SIGNAL, store, velocity};
use crate::audit::Actor;
use crate::model::SubjectKey;
use crate::scoring::{DecisionChange, Factor};

impl Lockouts {
    /// Lockouts matching `query`, newest first, and the cursor of the next page.
    pub async fn list(&self, query: &Query) -> Result<(Vec<Lockout>, Option<String>), Error> {
        let limit = query.limit.clamp(1, 500);
        let addresses = self.addresses(query).await?;
        if addresses.as_ref().is_some_and(Vec::is_empty) {
            return Ok((Vec::new(), None));
        }
        let mut items = store::list(
            &self.durable,
            query,
            addresses.as_deref(),
            self.clock.now_ms(),
            limit + 1,
        )
        .await?;
        let next = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|l| l.id.clone())
        } else {
            None
        };
        Ok((items, next))
    }

    /// The addresses seen in auth events within the query's network and ASN, if it names
    /// either.
    async fn addresses(&self, query: &Query) -> Result<Option<Vec<String>>, Error> {
        self.addresses_matching(query.ip.as_ref(), query.asn).await
    }

    /// The addresses seen in auth events within `ip` and of `asn` (None when neither is
    /// named: no address filter).
    pub async fn addresses_matching(
        &self,
        ip: Option<&ipnetwork::IpNetwork>,
        asn: Option<u32>,
    ) -> Result<Option<Vec<String>>, Error> {
        match (ip, asn) {
            (None, None) => Ok(None),
            (Some(net), None) => self.addresses_in(net).await.map(Some),
            (None, Some(asn)) => self.addresses_of(asn).await.map(Some),
            (Some(net), Some(asn)) => {
                let mut found = self.addresses_in(net).await?;
                found.retain(|ip| {
                    ip.parse()
                        .is_ok_and(|addr| self.scoring.asn_of(addr) == Some(asn))
                });
                Ok(Some(found))
            }
        }
    }

    /// The addresses seen in auth events that belong to `asn` (by the reputation data's
    /// ASN lookup).
    pub async fn addresses_of(&self, asn: u32) -> Result<Vec<String>, Error> {
        let keep = |addr| self.scoring.asn_of(addr) == Some(asn);
        store::addresses_where(&self.durable, "%", store::MAX_SCANNED, keep)
            .await?
            .map_err(|why| too_broad(&format!("AS{asn}"), why))
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
        let shown = self.scoring.pseudonyms().shown(&lockout.account);
        tracing::info!(lockout.id = %id, account.id = %shown, "released lockout {id} for account {shown}");
        store::get(&self.durable, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_owned()))
    }

    /// Moves the end of a lockout in force (extends or shortens it) to `until_ms`, at once
    /// on every instance: its row, its hot marker, the account's lockout factor and the
    /// decision stream; audited as `lockout.retime`.
    pub async fn retime(
        &self,
        id: &str,
        until_ms: i64,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Lockout, Error> {
        let lockout = store::get(&self.durable, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let now = self.clock.now_ms();
        if lockout.released_at_ms.is_some() || lockout.locked_until_ms <= now {
            return Err(Error::NotActive(id.to_owned()));
        }
        if !store::retime(&self.durable, id, until_ms).await? {
            return Err(Error::NotActive(id.to_owned()));
        }
        if let Ok(account) = SubjectKey::user(&lockout.account, usize::MAX) {
            velocity::retime(&self.hot, &self.keys, &account, id, now, until_ms - now).await?;
            let message = format!(
                "locked after {} failed logins (level {}) until {} (moved by {}: {reason})",
                lockout.failures,
                lockout.level,
                crate::clock::rfc3339(until_ms),
                actor.name
            );
            let factor = Factor::scale(SIGNAL, "lockout", 0.0, message)
                .on_classes(&["auth"])
                .referring_to(id.to_owned())
                .until(until_ms);
            self.scoring.assert(&account, factor).await?;
            self.scoring
                .record_change(DecisionChange {
                    cursor: String::new(),
                    kind: "lockout".to_owned(),
                    action: "set".to_owned(),
                    subject: account.to_string(),
                    classes: Default::default(),
                    expires_at_ms: Some(until_ms),
                    reasons: vec![
                        "account_failures".to_owned(),
                        "known_contexts_exempt".to_owned(),
                    ],
                    reference: Some(id.to_owned()),
                    list: None,
                    at_ms: now,
                })
                .await?;
        }
        self.audit
            .record(
                actor,
                "lockout.retime",
                id,
                serde_json::json!({
                    "account": lockout.account,
                    "reason": reason,
                    "from": crate::clock::rfc3339(lockout.locked_until_ms),
                    "to": crate::clock::rfc3339(until_ms),
                }),
                request_id,
            )
            .await?;
        store::get(&self.durable, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_owned()))
    }

    /// Forgets an account on the hot side at once on every instance (a data-subject
    /// erasure): its lock marker, failure windows, known contexts and stored factors; the
    /// decision stream tells gateways its lockout is gone. Its durable rows are erased by
    /// `analyst::subject::erase`.
    pub async fn forget(&self, account: &SubjectKey) -> Result<(), Error> {
        let now = self.clock.now_ms();
        if let Some((lockout_id, _)) = velocity::lock(&self.hot, &self.keys, account, now).await? {
            velocity::unlock(&self.hot, &self.keys, account, &lockout_id, now).await?;
            self.scoring
                .record_change(DecisionChange {
                    cursor: String::new(),
                    kind: "lockout".to_owned(),
                    action: "delete".to_owned(),
                    subject: account.to_string(),
                    classes: Default::default(),
                    expires_at_ms: None,
                    reasons: vec!["erased".to_owned()],
                    reference: Some(lockout_id),
                    list: None,
                    at_ms: now,
                })
                .await?;
        }
        velocity::clear(
            &self.hot,
            &[self.keys.windows(account), self.keys.known(account)],
        )
        .await?;
        let ids: Vec<String> = self
            .scoring
            .stored(account)
            .await?
            .iter()
            .map(Factor::id)
            .collect();
        if !ids.is_empty() {
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            self.scoring.retract(account, &refs).await?;
        }
        Ok(())
    }

    /// The addresses seen in auth events within `net` (for searches across domains).
    pub async fn addresses_in(&self, net: &ipnetwork::IpNetwork) -> Result<Vec<String>, Error> {
        store::addresses_in(&self.durable, net)
            .await?
            .map_err(|why| too_broad(&net.to_string(), why))
    }

    /// Clears what the engine concluded from a subject's behaviour (failures, spraying,
    /// anomalies, repeat offending: the factors of [`CLEARABLE`] but an account's lockout,
    /// which is released instead) and its failure windows, at once on every instance;
    /// audited as `penalty.clear` on the subject. Returns the factor ids cleared.
    pub async fn clear_penalties(
        &self,
        subject: &SubjectKey,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Vec<String>, Error> {
        let stored = self.scoring.stored(subject).await?;
        let lockout = format!("{SIGNAL}:lockout");
        let ids: Vec<String> = stored
            .iter()
            .map(Factor::id)
            .filter(|id| {
                *id != lockout
                    && CLEARABLE
                        .iter()
                        .any(|signal| id.split_once(':').is_some_and(|(s, _)| s == *signal))
            })
            .collect();
        velocity::clear(&self.hot, &[self.keys.windows(subject)]).await?;
        if !ids.is_empty() {
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            self.scoring.retract(subject, &refs).await?;
        }
        self.audit
            .record(
                actor,
                "penalty.clear",
                subject.as_str(),
                serde_json::json!({ "reason": reason, "cleared": ids }),
                request_id,
            )
            .await?;
        let shown = self.scoring.pseudonyms().shown_key(subject.as_str());
        tracing::info!(subject = %shown, cleared = ids.len(), "cleared penalties of {shown}");
        Ok(ids)
    }
}

/// Signals whose factors an analyst may clear: what the engine concluded from behaviour.
/// Lists and reputation are edited where they come from; attestation verdicts change by
/// attesting again.
pub const CLEARABLE: &[&str] = &[SIGNAL, "anomaly", "offender", "messaging"];

fn too_broad(what: &str, why: store::Search) -> Error {
    Error::TooBroad(match why {
        store::Search::TooMany => format!(
            "{what} holds more than {} addresses seen in auth events; search a narrower network",
            store::MAX_ADDRESSES
        ),
        store::Search::TooWide => format!(
            "searching {what} means looking at more than {} addresses seen in auth events; \
             search by network instead",
            store::MAX_SCANNED
        ),
    })
}
