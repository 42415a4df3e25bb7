//! Spraying: a source failing on many accounts is blocked on `auth`, a network or ASN
//! whose logins from unknown contexts keep being stopped has its block renewed, and one
//! that sprays below the block's threshold is suspected (its unknown contexts challenged).

use std::collections::HashSet;
use std::time::Duration;

use super::velocity::{self, Step};
use super::{Error, Lockouts, LoginContext, SIGNAL};
use crate::model::SubjectKey;
use crate::scoring::Factor;

impl Lockouts {
    /// A login stopped by its network's block or suspicion or by the login guard, from a
    /// context its account does not know: the guard counts it, and a network or ASN block
    /// (or suspicion) in its second half is renewed for `spray_block_s` once its threshold of
    /// distinct accounts were stopped there within the window (the spraying goes on;
    /// without this the block would lapse and let a threshold's worth of attempts through
    /// before it tipped again).
    pub async fn refused_unknown(&self, context: &LoginContext) -> Result<(), Error> {
        self.scoring.login_guard().refused(&context.ip);
        let now = self.clock.now_ms();
        let blocks = self.scoring.network_blocks();
        let half =
            i64::try_from(self.settings.spray_block_s.saturating_mul(500)).unwrap_or(i64::MAX);
        let account = Some(velocity::member_id(context.account.as_str()));
        let suspects = self.scoring.network_suspects();
        let mut steps = Vec::new();
        let mut renewing = Vec::new();
        for (source, threshold) in self.networks(context) {
            // A block, or else a suspicion (renewed at its own threshold).
            let (until, threshold) = match blocks.until(&source) {
                Some(until) => (until, threshold),
                None => match suspects.until(&source) {
                    Some(until) => (until, self.settings.suspect_accounts),
                    None => continue,
                },
            };
            if until <= now || until - now > half {
                continue;
            }
            steps.push(Step {
                cap: super::NETWORK_CAP,
                ..self.step(
                    (self.keys.windows(&source), super::REFUSED.to_owned()),
                    account,
                    now,
                )
            });
            renewing.push((source, threshold));
        }
        if steps.is_empty() {
            return Ok(());
        }
        let counts = velocity::run_sequence(&self.hot, &steps, now).await?;
        for ((source, threshold), (distinct, _)) in renewing.into_iter().zip(counts) {
            if distinct < threshold {
                continue;
            }
            if blocks.until(&source).is_some() {
                self.renew_block(&source, distinct, now).await?;
            } else {
                let until = now.saturating_add(self.spray_block_ms());
                suspects.block(&source, until).await?;
            }
        }
        Ok(())
    }

    /// Suspects the networks and ASNs not suspected yet, for `spray_block_s`.
    pub(super) async fn suspect(
        &self,
        mut sources: Vec<SubjectKey>,
        now: i64,
    ) -> Result<(), Error> {
        let suspects = self.scoring.network_suspects();
        let mut seen = HashSet::new();
        sources.retain(|s| seen.insert(s.clone()) && suspects.until(s).is_none_or(|u| u <= now));
        let until = now.saturating_add(self.spray_block_ms());
        for source in &sources {
            suspects.block(source, until).await?;
            let shown = self.scoring.pseudonyms().shown_key(source.as_str());
            tracing::info!(subject.key = %shown, "suspected of spraying: logins from contexts their accounts do not know are challenged there");
        }
        Ok(())
    }

    fn spray_block_ms(&self) -> i64 {
        i64::try_from(self.settings.spray_block_s.saturating_mul(1000)).unwrap_or(i64::MAX)
    }

    /// Renews a network's or ASN's spraying block for `spray_block_s` from `now`.
    async fn renew_block(&self, source: &SubjectKey, distinct: u32, now: i64) -> Result<(), Error> {
        let block_ms =
            i64::try_from(self.settings.spray_block_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let until = now.saturating_add(block_ms);
        let message = format!(
            "{source} went on spraying while blocked: logins on {distinct} accounts refused in {} min",
            self.settings.window_s / 60
        );
        self.block_source(source, message, until, None).await?;
        metrics::counter!(crate::telemetry::metrics::NETWORK_BLOCK_RENEWALS_TOTAL).increment(1);
        let shown = self.scoring.pseudonyms().shown_key(source.as_str());
        tracing::info!(subject.key = %shown, "spraying goes on: the block of {shown} is renewed");
        Ok(())
    }

    /// Multiplier 0 on `auth` for a spraying source until `until` (the factor refers to its
    /// alert, if given); a network or an ASN is blocked as a whole, every address in it
    /// whatever is published for each.
    async fn block_source(
        &self,
        source: &SubjectKey,
        message: String,
        until: i64,
        alert: Option<String>,
    ) -> Result<(), Error> {
        let mut factor = Factor::scale(SIGNAL, "spraying", 0.0, message)
            .on_classes(&["auth"])
            .until(until);
        if let Some(alert) = alert {
            factor = factor.referring_to(alert);
        }
        self.scoring.assert(source, factor).await?;
        if crate::scoring::NetworkBlocks::is_network(source) {
            self.scoring.network_blocks().block(source, until).await?;
        }
        Ok(())
    }

    /// A source failing on many accounts: multiplier 0 on `auth` for `spray_block_s`, and one
    /// alert per block period (the alert's marker decides, across instances).
    pub(super) async fn spraying(
        &self,
        source: &SubjectKey,
        distinct: u32,
        now: i64,
    ) -> Result<(), Error> {
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
        self.block_source(source, message, until, Some(alert.id))
            .await?;
        let shown = self.scoring.pseudonyms().shown_key(source.as_str());
        tracing::info!(subject.key = %shown, "spraying: {shown} failed on many accounts; auth multiplier 0");
        Ok(())
    }
}
