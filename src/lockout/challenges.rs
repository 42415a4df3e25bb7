//! Login challenges: what a login from a context its account does not know gets while the
//! login guard is on or its network is blocked for spraying, and how the auth service
//! reports one passed.
//!
//! A first sign-in looks exactly like stuffing, so such a login is not refused: it is allowed
//! on condition of a step-up the app already has (a code sent by e-mail or SMS, a passkey, a
//! CAPTCHA, a fresh attestation). The challenge is counted as a failure for the guard and
//! the network's block when it is issued; a person who passes it makes the context known to
//! the account (`challenge_passed`), an attacker who cannot is stopped at the step-up.
//! A challenge is a marker in the account's hash slot, valid `lockout.challenge_ttl_s`.

use super::{Error, Lockouts, LoginContext};
use crate::config::UnknownContext;
use crate::model::SubjectKey;
use crate::store::Hot;
use crate::telemetry::metrics as names;

/// True when `id` can be a challenge id (a ULID as issued; 1–64 ASCII letters and digits).
pub fn challenge_id_valid(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Why a reported `challenge_passed` was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeRejection {
    /// Never issued for this account, or expired.
    Unknown,
}

impl ChallengeRejection {
    /// A sentence for the event's error.
    pub fn message(self) -> &'static str {
        match self {
            ChallengeRejection::Unknown => {
                "challenge_id was not issued for this account or has expired: check the login again for a new challenge"
            }
        }
    }
}

impl Lockouts {
    /// A login the network's block or the login guard stopped from a context its account
    /// does not know: counted as evidence that the attack goes on, then answered with a
    /// login challenge's id (None under `lockout.unknown_context = "refuse"`).
    pub async fn unknown_context(&self, context: &LoginContext) -> Result<Option<String>, Error> {
        self.refused_unknown(context).await?;
        if self.settings.unknown_context == UnknownContext::Refuse {
            return Ok(None);
        }
        let id = self.clock.new_id().to_string();
        let now = self.clock.now_ms();
        let ttl_ms = self.challenge_ttl_ms();
        let key = self.challenge_key(&context.account, &id);
        match &self.hot {
            Hot::Memory(memory) => {
                memory.value_set_nx(&key, "1", now, ttl_ms);
            }
            Hot::Redis(redis) => {
                redis
                    .query::<()>(redis::cmd("SET").arg(&key).arg(1).arg("PX").arg(ttl_ms))
                    .await?;
            }
        }
        metrics::counter!(names::LOGIN_CHALLENGES_TOTAL, "event" => "issued").increment(1);
        Ok(Some(id))
    }

    /// Whether each `(account, challenge id)` names a challenge issued for that account and
    /// not expired (a challenge may be reported passed more than once: a retried batch).
    pub async fn check_challenges(
        &self,
        challenges: &[(&SubjectKey, &str)],
    ) -> Result<Vec<Result<(), ChallengeRejection>>, Error> {
        let now = self.clock.now_ms();
        let mut out = Vec::with_capacity(challenges.len());
        for &(account, id) in challenges {
            let key = self.challenge_key(account, id);
            let issued = match &self.hot {
                Hot::Memory(memory) => memory.value_get(&key, now).is_some(),
                Hot::Redis(redis) => redis.query::<bool>(redis::cmd("EXISTS").arg(&key)).await?,
            };
            out.push(if issued {
                Ok(())
            } else {
                Err(ChallengeRejection::Unknown)
            });
        }
        Ok(out)
    }

    /// Counts challenges reported passed (a batch stored for the first time).
    pub fn challenges_passed(count: usize) {
        if count > 0 {
            metrics::counter!(names::LOGIN_CHALLENGES_TOTAL, "event" => "passed")
                .increment(count as u64);
        }
    }

    fn challenge_key(&self, account: &SubjectKey, id: &str) -> String {
        self.keys.marker(account, &format!("challenge:{id}"))
    }

    fn challenge_ttl_ms(&self) -> i64 {
        i64::try_from(self.settings.challenge_ttl_s.saturating_mul(1000)).unwrap_or(i64::MAX)
    }
}
