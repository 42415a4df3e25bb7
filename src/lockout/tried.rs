//! Logins a source's own budget refused: evidence of spraying too.
//!
//! A source trying many accounts is spraying whether its attempts fail or are refused. The
//! spraying windows of an address and a device count the accounts whose logins failed from
//! them; once the source's `auth` budget refuses most of its attempts, only a trickle fails,
//! and the block waited for that trickle (a stolen device id tried on one account a second got
//! nine more accounts through after its first refusal). So the accounts a budget refused from
//! contexts they do not know count too, in a window of their own; a source is spraying when
//! the two together reach `lockout.spray_accounts` and at least half of that failed (an
//! office behind one address whose new sign-ins wait for its budget has few failures).

use super::velocity::{self, Step};
use super::{Error, Lockouts, LoginContext};

/// The distinct accounts whose logins the source's budget refused from contexts they do not
/// know, in an address's or a device's value.
const TRIED: &str = "t";

/// The class whose logins count (the one lockouts and spraying blocks act on).
pub const LOGIN_CLASS: &str = "auth";

impl Lockouts {
    /// A login of `class` refused by its address's or device's budget: when its account
    /// does not know the context, the account counts among those tried from the address and
    /// the device, and a source that reached its spraying threshold is blocked.
    pub async fn refused_by_budget(
        &self,
        class: &str,
        context: &LoginContext,
    ) -> Result<(), Error> {
        if class != LOGIN_CLASS || self.knows(context).await? {
            return Ok(());
        }
        let now = self.clock.now_ms();
        let account = Some(velocity::member_id(context.account.as_str()));
        let mut sources = vec![(&context.ip_key, self.spray_threshold(context))];
        if let Some(device) = &context.device {
            sources.push((device, self.settings.spray_accounts));
        }
        let mut steps: Vec<Step> = Vec::with_capacity(sources.len() * 2);
        for (source, _) in &sources {
            let key = self.keys.windows(source);
            steps.push(self.step((key.clone(), TRIED.to_owned()), account, now));
            // The accounts that failed from it: counted, nothing added.
            steps.push(self.step((key, "a".to_owned()), None, now));
        }
        let counts = velocity::run_sequence(&self.hot, &steps, now).await?;
        for ((source, threshold), pair) in sources.into_iter().zip(counts.chunks(2)) {
            let (tried, failed) = (pair[0].0, pair.get(1).map_or(0, |c| c.0));
            if failed.saturating_mul(2) >= threshold && tried + failed >= threshold {
                self.spraying(source, tried + failed, now).await?;
            }
        }
        Ok(())
    }

    /// Accounts failing from the context's address that make it spraying (more at a shared
    /// address, where many people fail).
    pub(super) fn spray_threshold(&self, context: &LoginContext) -> u32 {
        let shared = self.scoring.shared_ips();
        let factor = if shared.is_shared(&context.ip) {
            shared.settings().spray_factor
        } else {
            1
        };
        self.settings.spray_accounts.saturating_mul(factor)
    }
}
