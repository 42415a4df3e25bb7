//! Single-use challenges: issued per device, consumed once by the submission that answers.

use super::{Attestation, Error, Rejection};
use crate::model::SubjectKey;
use crate::store::Hot;
use crate::store::scripts::CHALLENGE_CONSUME;

/// A used or expired challenge is remembered this long, so it is named as such.
const TOMBSTONE_MS: i64 = 3_600_000;

impl Attestation {
    /// Issues a single-use challenge for `device`; returns it and its expiry (Unix ms).
    pub async fn challenge(&self, device: &SubjectKey) -> Result<(String, i64), Error> {
        use base64::Engine as _;
        let mut raw = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut raw);
        let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let now = self.clock.now_ms();
        let ttl_ms =
            i64::try_from(self.settings.challenge_ttl_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let expires = now.saturating_add(ttl_ms);
        let key = self.keys.marker(device, &format!("challenge:{challenge}"));
        let keep = ttl_ms.saturating_add(TOMBSTONE_MS);
        match &self.hot {
            Hot::Memory(memory) => {
                memory.value_set_nx(&key, &expires.to_string(), now, keep);
            }
            Hot::Redis(redis) => {
                redis
                    .query::<()>(redis::cmd("SET").arg(&key).arg(expires).arg("PX").arg(keep))
                    .await?;
            }
        }
        Ok((challenge, expires))
    }

    pub(super) async fn consume(&self, device: &SubjectKey, challenge: &str) -> Result<(), Error> {
        let valid = !challenge.is_empty()
            && challenge.len() <= 128
            && challenge
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(Rejection::ChallengeUnknown.into());
        }
        let key = self.keys.marker(device, &format!("challenge:{challenge}"));
        let now = self.clock.now_ms();
        let outcome = match &self.hot {
            Hot::Memory(memory) => memory
                .value_update(&key, now, |value| match value {
                    None => (None, "unknown"),
                    Some("used") => (None, "replayed"),
                    Some(expiry) if expiry.parse::<i64>().is_ok_and(|at| now > at) => {
                        (None, "expired")
                    }
                    Some(_) => (Some(("used".to_owned(), TOMBSTONE_MS)), "ok"),
                })
                .to_owned(),
            Hot::Redis(redis) => {
                redis
                    .eval::<String>(
                        &CHALLENGE_CONSUME,
                        &[key],
                        &[now.to_string(), TOMBSTONE_MS.to_string()],
                    )
                    .await?
            }
        };
        match outcome.as_str() {
            "ok" => Ok(()),
            "expired" => Err(Rejection::ChallengeExpired.into()),
            "replayed" => Err(Rejection::ChallengeReplayed.into()),
            _ => Err(Rejection::ChallengeUnknown.into()),
        }
    }
}
