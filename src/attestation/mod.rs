//! Device attestation: single-use challenges, Play Integrity and App Attest verified locally,
//! verdict levels per device feeding its `device:` multiplier.
//!
//! Read [`play_integrity::evaluate`] and [`app_attest::verify_attestation`] first (pure).
//! [`Attestation::submit`] consumes the challenge, verifies, stores the verdict durably and
//! asserts the device's `attestation` factor in scoring. Any check that fails is a
//! [`Rejection`] with a distinct code and stores nothing: only a statement the platform
//! signed becomes a verdict (including a negative one, e.g. "meets no device integrity"), so
//! a forged or garbled submission cannot downgrade a device. A device with no valid verdict
//! is `unverified` ([`UnverifiedSignal`], a pull signal: tighter on public classes).

pub mod app_attest;
pub mod play_integrity;
mod store;
pub mod testing;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::clock::Clock;
use crate::config::{AttestationSettings, Settings};
use crate::model::{Reason, SubjectKey, SubjectKind};
use crate::scoring::{Change, Engine, Factor, Signal, Subject};
use crate::store::scripts::CHALLENGE_CONSUME;
use crate::store::{Durable, Hot, Keys, Stores};
use crate::telemetry::metrics as names;

/// Name of the signal in factors and reasons.
pub const SIGNAL: &str = "attestation";
/// A used or expired challenge is remembered this long, so it is named as such.
const TOMBSTONE_MS: i64 = 3_600_000;

/// A device's attestation level, weakest first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// The platform says the app or device is not genuine.
    Failed,
    /// No valid verdict.
    Unverified,
    /// Basic integrity (possibly rooted or virtual).
    Basic,
    /// A genuine device.
    Device,
    /// A genuine device with a hardware-backed key (Play STRONG, App Attest).
    Strong,
}

impl Level {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Failed => "failed",
            Level::Unverified => "unverified",
            Level::Basic => "basic",
            Level::Device => "device",
            Level::Strong => "strong",
        }
    }

    fn parse(text: &str) -> Level {
        match text {
            "failed" => Level::Failed,
            "basic" => Level::Basic,
            "device" => Level::Device,
            "strong" => Level::Strong,
            _ => Level::Unverified,
        }
    }
}

/// Why a submission was refused; each has a stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// No such challenge was issued for this device (or it was forgotten).
    #[error("unknown challenge: it was not issued for this device")]
    ChallengeUnknown,
    /// Issued, but past its expiry.
    #[error("the challenge has expired; ask for a new one")]
    ChallengeExpired,
    /// Used before.
    #[error("the challenge was already used (single use)")]
    ChallengeReplayed,
    /// The input does not parse.
    #[error("malformed: {0}")]
    Malformed(String),
    /// Not an attestation format this service verifies.
    #[error("unsupported format: {0}")]
    UnsupportedFormat(String),
    /// A JOSE algorithm other than the ones Google uses.
    #[error("unsupported algorithm: {0}")]
    UnsupportedAlgorithm(String),
    /// The certificate chain does not lead to the configured root.
    #[error("certificate chain invalid: {0}")]
    ChainInvalid(String),
    /// A certificate is not valid at this time.
    #[error("certificate not valid now: {0}")]
    CertificateExpired(String),
    /// The nonce is not the one derived from the challenge.
    #[error("nonce mismatch: {0}")]
    NonceMismatch(String),
    /// The key id is not the key's.
    #[error("key id mismatch: {0}")]
    KeyIdMismatch(String),
    /// The RP ID hash is not one of our app ids.
    #[error("app id mismatch: {0}")]
    AppIdMismatch(String),
    /// An attestation's counter is not 0.
    #[error("counter not zero: {0}")]
    CounterNotZero(String),
    /// Wrong App Attest environment.
    #[error("aaguid mismatch: {0}")]
    AaguidMismatch(String),
    /// The credential id is not the key id.
    #[error("credential id mismatch: {0}")]
    CredentialIdMismatch(String),
    /// A signature does not verify.
    #[error("signature invalid: {0}")]
    SignatureInvalid(String),
    /// An assertion counter that does not grow.
    #[error("counter replayed: {0}")]
    CounterReplayed(String),
    /// An assertion by a key never attested (or attested for another device).
    #[error("unknown key: {0}")]
    UnknownKey(String),
    /// The key was attested before (a key is attested once).
    #[error("key already attested: {0}")]
    KeyAlreadyAttested(String),
    /// The token does not decrypt (tampered, or another app's key).
    #[error("decryption failed: {0}")]
    DecryptionFailed(String),
    /// Not one of our package names.
    #[error("package mismatch: {0}")]
    PackageMismatch(String),
    /// Not signed with one of our signing certificates.
    #[error("certificate digest mismatch: {0}")]
    CertificateDigestMismatch(String),
    /// Too old (or from the future).
    #[error("stale timestamp: {0}")]
    StaleTimestamp(String),
    /// This kind of attestation is not configured.
    #[error("not configured: set {0}")]
    NotConfigured(&'static str),
    /// A caller-decoded (unsigned) verdict may not replace the device's verified one.
    #[error("a verified verdict of this device stands until {0}; send the integrity token")]
    VerifiedVerdictStands(String),
}

impl Rejection {
    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::ChallengeUnknown => "challenge_unknown",
            Rejection::ChallengeExpired => "challenge_expired",
            Rejection::ChallengeReplayed => "challenge_replayed",
            Rejection::Malformed(_) => "malformed",
            Rejection::UnsupportedFormat(_) => "unsupported_format",
            Rejection::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            Rejection::ChainInvalid(_) => "chain_invalid",
            Rejection::CertificateExpired(_) => "certificate_expired",
            Rejection::NonceMismatch(_) => "nonce_mismatch",
            Rejection::KeyIdMismatch(_) => "key_id_mismatch",
            Rejection::AppIdMismatch(_) => "app_id_mismatch",
            Rejection::CounterNotZero(_) => "counter_not_zero",
            Rejection::AaguidMismatch(_) => "aaguid_mismatch",
            Rejection::CredentialIdMismatch(_) => "credential_id_mismatch",
            Rejection::SignatureInvalid(_) => "signature_invalid",
            Rejection::CounterReplayed(_) => "counter_replayed",
            Rejection::UnknownKey(_) => "unknown_key",
            Rejection::KeyAlreadyAttested(_) => "key_already_attested",
            Rejection::DecryptionFailed(_) => "decryption_failed",
            Rejection::PackageMismatch(_) => "package_mismatch",
            Rejection::CertificateDigestMismatch(_) => "certificate_digest_mismatch",
            Rejection::StaleTimestamp(_) => "stale_timestamp",
            Rejection::NotConfigured(_) => "not_configured",
            Rejection::VerifiedVerdictStands(_) => "verified_verdict_stands",
        }
    }
}

/// Why an attestation operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The submission was refused; nothing stored.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

impl From<crate::scoring::Error> for Error {
    fn from(err: crate::scoring::Error) -> Self {
        match err {
            crate::scoring::Error::Store(store) => Error::Store(store),
        }
    }
}

/// What a device submits.
#[derive(Debug, Clone)]
pub enum Submission {
    /// A raw Play Integrity token (JWE).
    PlayIntegrityToken(String),
    /// A verdict the caller decoded with Google's `decodeIntegrityToken`.
    PlayIntegrityVerdict(serde_json::Value),
    /// An App Attest attestation object for a new key.
    AppAttestAttestation {
        /// The CBOR attestation object.
        object: Vec<u8>,
        /// The key id (SHA-256 of the public key).
        key_id: Vec<u8>,
    },
    /// An App Attest assertion by an attested key.
    AppAttestAssertion {
        /// The CBOR assertion.
        assertion: Vec<u8>,
        /// The key id.
        key_id: Vec<u8>,
    },
}

impl Submission {
    /// `play_integrity` or `app_attest`.
    pub fn platform(&self) -> &'static str {
        match self {
            Submission::PlayIntegrityToken(_) | Submission::PlayIntegrityVerdict(_) => {
                "play_integrity"
            }
            _ => "app_attest",
        }
    }
}

/// The reason code marking a verdict the caller decoded (unsigned).
pub const DECODED: &str = "decoded_by_caller";

/// A stored verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// ULID.
    pub id: String,
    /// The device.
    pub device_id: String,
    /// `play_integrity` or `app_attest`.
    pub platform: String,
    /// The level.
    pub level: Level,
    /// Why.
    pub reasons: Vec<Reason>,
    /// Unix ms.
    pub verified_at_ms: i64,
    /// Unix ms after which the device is unverified again.
    pub expires_at_ms: i64,
}

impl Verdict {
    /// True when it came from a verdict the caller decoded (unsigned).
    pub fn is_decoded(&self) -> bool {
        self.reasons.iter().any(|r| r.code == DECODED)
    }
}

/// Apple's App Attestation Root CA (public; SHA-256 fingerprint
/// `1cb9823b…6242c932`, valid 2020-03-18 to 2045-03-15), used unless
/// `attestation.app_attest.root_ca` names another file.
pub const APPLE_ROOT_PEM: &[u8] =
    include_bytes!("../../data/attestation/Apple_App_Attestation_Root_CA.pem");

/// The DER of a PEM certificate.
fn parse_root(pem: &[u8]) -> Result<Vec<u8>, String> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("not a PEM certificate: {e}"))?;
    pem.parse_x509()
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(pem.contents)
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
#[error("PALISADE_ATTESTATION__APP_ATTEST__ROOT_CA (attestation.app_attest.root_ca): {0}")]
pub struct LoadError(pub String);

/// The attestation service.
#[derive(Debug)]
pub struct Attestation {
    settings: AttestationSettings,
    public_classes: Vec<String>,
    durable: Durable,
    hot: Hot,
    keys: Keys,
    clock: Arc<dyn Clock>,
    scoring: Arc<Engine>,
    root_der: Vec<u8>,
    play_keys: Option<play_integrity::Keys>,
    digests: Vec<Vec<u8>>,
}

impl Attestation {
    /// The service; reads Apple's root CA from `attestation.app_attest.root_ca` if set, else
    /// uses the copy built in ([`APPLE_ROOT_PEM`]).
    pub fn new(
        settings: &Settings,
        stores: &Stores,
        clock: Arc<dyn Clock>,
        scoring: Arc<Engine>,
    ) -> Result<Self, LoadError> {
        let attestation = settings.attestation.clone();
        let root_der = match &attestation.app_attest.root_ca {
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| LoadError(format!("{}: {e}", path.display())))?;
                parse_root(&pem).map_err(|e| LoadError(format!("{}: {e}", path.display())))?
            }
            None => parse_root(APPLE_ROOT_PEM)
                .map_err(|e| LoadError(format!("the built-in Apple root: {e}")))?,
        };
        let play = &attestation.play_integrity;
        // Validated by the settings: both decode.
        let play_keys = match (&play.decryption_key, &play.verification_key) {
            (Some(decryption), Some(verification)) => Some(play_integrity::Keys {
                decryption: play_integrity::decode_key(decryption.expose(), 32).unwrap_or_default(),
                verification: play_integrity::VerificationKey::from_base64(verification)
                    .ok_or_else(|| LoadError("verification key".to_owned()))?,
            }),
            _ => None,
        };
        if play.accept_decoded {
            if play_keys.is_some() {
                tracing::warn!(
                    "attestation.play_integrity.accept_decoded is on, but the verification keys are configured: decoded verdicts are refused, send integrity tokens"
                );
            } else {
                tracing::warn!(
                    "attestation.play_integrity.accept_decoded is on: unsigned verdicts decoded by the caller are accepted (capped at device integrity, marked decoded_by_caller); configure the Play Integrity keys to verify tokens instead"
                );
            }
        }
        let digests = play
            .certificate_sha256
            .iter()
            .filter_map(|d| play_integrity::decode_digest(d))
            .collect();
        Ok(Self {
            public_classes: settings.scoring.public_classes.clone(),
            settings: attestation,
            durable: stores.durable.clone(),
            hot: stores.hot.clone(),
            keys: stores.keys.clone(),
            clock,
            scoring,
            root_der,
            play_keys,
            digests,
        })
    }

    /// The pull signal giving devices without a verdict the `unverified` factor.
    pub fn unverified_signal(&self) -> UnverifiedSignal {
        UnverifiedSignal {
            settings: self.settings.clone(),
            public_classes: self.public_classes.clone(),
        }
    }

    /// Which devices count as attested (a fresh verdict of device integrity or better), for
    /// the lockout-DoS rule.
    pub fn attested_devices(&self) -> AttestedDevices {
        AttestedDevices {
            scoring: self.scoring.clone(),
            clock: self.clock.clone(),
        }
    }

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

    async fn consume(&self, device: &SubjectKey, challenge: &str) -> Result<(), Error> {
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
            tracing::info!(
                device.id = device_id,
                attestation.reason = rejection.code(),
                "attestation for {device_id} rejected: {rejection}"
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
                if !store::insert_key(
                    &self.durable,
                    &key_hex,
                    device_id,
                    &attested.app_id,
                    &hex(&attested.public_key),
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
                let public_key = unhex(&key.public_key).unwrap_or_default();
                let last = u32::try_from(key.counter).unwrap_or(u32::MAX);
                let counter = app_attest::verify_assertion(
                    &assertion,
                    &client_data_hash,
                    &public_key,
                    app_ids,
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// Devices holding an unexpired `strong` or `device` verdict (read from the device's stored
/// factors, which every instance shares): a known context for the lockout-DoS rule.
#[derive(Debug)]
pub struct AttestedDevices {
    scoring: Arc<Engine>,
    clock: Arc<dyn Clock>,
}

impl crate::lockout::AttestedDevices for AttestedDevices {
    fn is_attested<'a>(
        &'a self,
        device: &'a SubjectKey,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>> {
        Box::pin(async move {
            let now = self.clock.now_ms();
            let factors = self.scoring.stored(device).await.map_err(|err| match err {
                crate::scoring::Error::Store(store) => store,
            })?;
            Ok(factors.iter().any(|f| {
                f.signal == SIGNAL
                    && matches!(f.code.as_str(), "attestation_strong" | "attestation_device")
                    && f.expires_at_ms.is_none_or(|at| at > now)
            }))
        })
    }
}

/// Devices without a valid verdict are `unverified` (a pull signal: no write per device).
#[derive(Debug)]
pub struct UnverifiedSignal {
    settings: AttestationSettings,
    public_classes: Vec<String>,
}

impl Signal for UnverifiedSignal {
    fn name(&self) -> &'static str {
        SIGNAL
    }

    fn factors(&self, subject: &Subject<'_>, stored: &[Factor], _now_ms: i64) -> Vec<Factor> {
        if subject.key.kind() != SubjectKind::Device || stored.iter().any(|f| f.signal == SIGNAL) {
            return Vec::new();
        }
        vec![
            Factor::scale(
                SIGNAL,
                "attestation_unverified",
                self.settings.factor("unverified", false),
                "no valid attestation for this device",
            )
            .with_class_value(
                &self.public_classes,
                self.settings.factor("unverified", true),
            ),
        ]
    }
}

impl Verdict {
    fn from_row(row: store::VerdictRow) -> Verdict {
        Verdict {
            id: row.id,
            device_id: row.device_id,
            platform: row.platform,
            level: Level::parse(&row.level),
            reasons: serde_json::from_str(&row.reasons).unwrap_or_default(),
            verified_at_ms: row.verified_at,
            expires_at_ms: row.expires_at,
        }
    }
}
