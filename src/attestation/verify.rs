//! Verifying a submission: the challenge consumed, the platform's statement checked, the
//! verdict stored and the device's factor asserted.

use sha2::{Digest, Sha256};

use super::{
    Attestation, DECODED, Error, Level, Rejection, SIGNAL, Submission, Verdict, app_attest, hex,
    play_integrity, store, unhex,
};
use crate::model::{Reason, SubjectKey};
use crate::scoring::{Change, Factor};
use crate::telemetry::metrics as names;

impl Attestation {
    /// Verifies a submission for `device` (`device_id` as sent) against the challenge it was
    /// issued; stores the verdict and feeds the device's factor. A failed check is a
    /// [`Rejection`] and stores nothing.
    pub async fn submit(
        &self,
        device: &SubjectKey,
        device_id: &str,
        challenge: &str,
        submission: Submission,
    ) -> Result<Verdict, Error> {
        let platform = submission.platform();
        let result = self.verify(device, device_id, challenge, submission).await;
        let outcome = match &result {
            Ok(verdict) => verdict.level.as_str(),
            Err(Error::Rejected(rejection)) => rejection.code(),
            Err(Error::Store(_)) => "store_error",
        };
        metrics::counter!(names::ATTESTATIONS_TOTAL, "platform" => platform, "outcome" => outcome)
            .increment(1);
        if let Err(Error::Rejected(rejection)) = &result {
            let device = self.scoring.pseudonyms().shown(device_id);
            tracing::info!(
                device.id = %device,
                attestation.reason = rejection.code(),
                "attestation for {device} rejected: {rejection}"
            );
        }
        result
    }

    async fn verify(
        &self,
        device: &SubjectKey,
        device_id: &str,
        challenge: &str,
        submission: Submission,
    ) -> Result<Verdict, Error> {
        // Settings first: an unconfigured platform does not use up the challenge.
        let app_ids = &self.settings.app_attest.app_ids;
        let play = &self.settings.play_integrity;
        match &submission {
            Submission::PlayIntegrityToken(_) if self.play_keys.is_none() => {
                return Err(
                    Rejection::NotConfigured("attestation.play_integrity.decryption_key").into(),
                );
            }
            Submission::PlayIntegrityVerdict(_) if !play.accept_decoded => {
                return Err(Rejection::UnsupportedFormat(
                    "decoded verdicts are turned off (attestation.play_integrity.accept_decoded)"
                        .to_owned(),
                )
                .into());
            }
            // With the keys here the token itself can be verified: an unsigned verdict would
            // only be a way around that.
            Submission::PlayIntegrityVerdict(_) if self.play_keys.is_some() => {
                return Err(Rejection::UnsupportedFormat(
                    "send the integrity token: decoded verdicts are refused while \
                     attestation.play_integrity.decryption_key is configured"
                        .to_owned(),
                )
                .into());
            }
            Submission::PlayIntegrityToken(_) | Submission::PlayIntegrityVerdict(_)
                if play.package_names.is_empty() =>
            {
                return Err(
                    Rejection::NotConfigured("attestation.play_integrity.package_names").into(),
                );
            }
            Submission::AppAttestAttestation { .. } | Submission::AppAttestAssertion { .. }
                if app_ids.is_empty() =>
            {
                return Err(Rejection::NotConfigured("attestation.app_attest.app_ids").into());
            }
            _ => {}
        }
        // A device id belongs to the platform it first attested on.
        let platform = match &submission {
            Submission::PlayIntegrityToken(_) | Submission::PlayIntegrityVerdict(_) => {
                "play_integrity"
            }
            Submission::AppAttestAttestation { .. } | Submission::AppAttestAssertion { .. } => {
                "app_attest"
            }
        };
        if let Some(current) = store::latest(&self.durable, device_id).await?
            && current.platform != platform
        {
            return Err(Rejection::DeviceBound(format!(
                "this device id attested with {} first; a device id belongs to one platform",
                current.platform
            ))
            .into());
        }
        self.consume(device, challenge).await?;
        let now = self.clock.now_ms();
        let client_data_hash = Sha256::digest(challenge.as_bytes());
        let (platform, level, reasons) = match submission {
            Submission::PlayIntegrityToken(token) => {
                let keys = self.play_keys.as_ref().ok_or(Rejection::NotConfigured(
                    "attestation.play_integrity.decryption_key",
                ))?;
                let payload = play_integrity::decrypt_and_verify(&token, keys)?;
                self.play_verdict(
                    &payload,
                    challenge,
                    now,
                    Reason::new(
                        "play_integrity_token",
                        "integrity token decrypted and its signature verified",
                    ),
                )?
            }
            Submission::PlayIntegrityVerdict(payload) => {
                // Unsigned: it never replaces a verified verdict, and never reaches strong.
                if let Some(current) = store::latest(&self.durable, device_id).await?
                    && current.expires_at_ms > now
                    && !current.is_decoded()
                {
                    return Err(Rejection::VerifiedVerdictStands(crate::clock::rfc3339(
                        current.expires_at_ms,
                    ))
                    .into());
                }
                let (platform, level, mut reasons) = self.play_verdict(
                    &payload,
                    challenge,
                    now,
                    Reason::new(DECODED, "an unsigned verdict decoded by the caller"),
                )?;
                if level > Level::Device {
                    reasons.push(Reason::new(
                        "capped_unsigned",
                        "an unsigned verdict counts as device integrity at most",
                    ));
                }
                (platform, level.min(Level::Device), reasons)
            }
            Submission::AppAttestAttestation { object, key_id } => {
                let root = &self.root_der;
                let attested = app_attest::verify_attestation(
                    &object,
                    &key_id,
                    &client_data_hash,
                    app_ids,
                    self.settings.app_attest.environment,
                    root,
                    now / 1000,
                )?;
                let key_hex = hex(&key_id);
                // One key per device id: a second key (a reinstall, or someone else's
                // genuine device) must come with a new id.
                if let Some(bound) = store::device_key(&self.durable, device_id).await?
                    && bound.key_id != key_hex
                {
                    return Err(Rejection::DeviceBound(
                        "this device id is bound to another App Attest key; a new install \
                         sends a new device id"
                            .to_owned(),
                    )
                    .into());
                }
                if !store::insert_key(
                    &self.durable,
                    &key_hex,
                    device_id,
                    &attested.app_id,
                    &hex(&attested.public_key),
                    &hex(&attested.receipt),
                    now,
                )
                .await?
                {
                    return Err(Rejection::KeyAlreadyAttested(
                        "this key id was attested before; an app attests a key once".to_owned(),
                    )
                    .into());
                }
                let reasons = vec![Reason::new(
                    "app_attest_attested",
                    format!(
                        "App Attest key attested for {} by Apple's App Attestation CA",
                        attested.app_id
                    ),
                )];
                ("app_attest", Level::Strong, reasons)
            }
            Submission::AppAttestAssertion { assertion, key_id } => {
                let key_hex = hex(&key_id);
                let Some(key) = store::key(&self.durable, &key_hex).await? else {
                    return Err(Rejection::UnknownKey(
                        "no attested App Attest key with this id".to_owned(),
                    )
                    .into());
                };
                if key.device_id != device_id {
                    return Err(Rejection::UnknownKey(
                        "the key was attested for another device".to_owned(),
                    )
                    .into());
                }
                // The key's own app, and only while that app is still configured.
                if !app_ids.contains(&key.app_id) {
                    return Err(Rejection::AppIdMismatch(format!(
                        "the key was attested for {}, which is no longer configured",
                        key.app_id
                    ))
                    .into());
                }
                let public_key = unhex(&key.public_key).unwrap_or_default();
                let last = u32::try_from(key.counter).unwrap_or(u32::MAX);
                let counter = app_attest::verify_assertion(
                    &assertion,
                    &client_data_hash,
                    &public_key,
                    std::slice::from_ref(&key.app_id),
                    last,
                )?;
                // The database decides a race: a counter only passes once.
                if !store::advance_counter(&self.durable, &key_hex, i64::from(counter), now).await?
                {
                    return Err(Rejection::CounterReplayed(format!(
                        "counter {counter} was used by a concurrent assertion"
                    ))
                    .into());
                }
                let reasons = vec![Reason::new(
                    "app_attest_assertion",
                    format!("assertion by the attested key (counter {counter})"),
                )];
                ("app_attest", Level::Strong, reasons)
            }
        };
        let ttl_ms =
            i64::try_from(self.settings.verdict_ttl_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let verdict = Verdict {
            id: self.clock.new_id().to_string(),
            device_id: device_id.to_owned(),
            platform: platform.to_owned(),
            level,
            reasons,
            verified_at_ms: now,
            expires_at_ms: now.saturating_add(ttl_ms),
        };
        store::insert_verdict(&self.durable, &verdict).await?;
        self.scoring.apply(device, &self.changes(&verdict)).await?;
        Ok(verdict)
    }

    /// A Play Integrity payload checked against this app; `how` (how it reached us) is the
    /// first reason.
    fn play_verdict(
        &self,
        payload: &serde_json::Value,
        challenge: &str,
        now_ms: i64,
        how: Reason,
    ) -> Result<(&'static str, Level, Vec<Reason>), Rejection> {
        let (level, mut reasons) =
            play_integrity::evaluate(payload, &self.expected(challenge, now_ms))?;
        reasons.insert(0, how);
        Ok(("play_integrity", level, reasons))
    }

    fn expected<'a>(&'a self, challenge: &'a str, now_ms: i64) -> play_integrity::Expected<'a> {
        let play = &self.settings.play_integrity;
        play_integrity::Expected {
            package_names: &play.package_names,
            certificate_digests: &self.digests,
            challenge,
            max_age_ms: i64::try_from(play.max_age_s.saturating_mul(1000)).unwrap_or(i64::MAX),
            now_ms,
            require_licensed: play.require_licensed,
        }
    }

    /// The device's factor for a verdict, replacing the factor of any other level.
    fn changes(&self, verdict: &Verdict) -> Vec<Change> {
        let level = verdict.level.as_str();
        let codes: Vec<&str> = verdict.reasons.iter().map(|r| r.code.as_str()).collect();
        let factor = Factor::scale(
            SIGNAL,
            &format!("attestation_{level}"),
            self.settings.factor(level, false),
            format!(
                "{} verdict {level} ({})",
                verdict.platform,
                codes.join(", ")
            ),
        )
        .with_class_value(&self.public_classes, self.settings.factor(level, true))
        .until(verdict.expires_at_ms)
        .referring_to(verdict.id.clone());
        let mut changes: Vec<Change> = crate::config::LEVELS
            .iter()
            .filter(|other| **other != level)
            .map(|other| Change::Delete(format!("{SIGNAL}:attestation_{other}")))
            .collect();
        changes.push(Change::Set(factor));
        changes
    }

    /// The device's newest verdict, if it has one (expired ones included: check
    /// `expires_at_ms`).
    pub async fn current(&self, device_id: &str) -> Result<Option<Verdict>, Error> {
        Ok(store::latest(&self.durable, device_id).await?)
    }
}
