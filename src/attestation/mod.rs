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
mod challenge;
pub mod play_integrity;
mod signals;
mod store;
pub mod testing;
mod verify;

pub use signals::{AttestedDevices, UnverifiedSignal};

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::config::{AttestationSettings, Settings};
use crate::model::{Reason, encoding};
use crate::scoring::Engine;
use crate::store::{Durable, Hot, Keys, Stores};

/// Name of the signal in factors and reasons.
pub const SIGNAL: &str = "attestation";

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
    /// An emulator Google Play vouches for (`MEETS_VIRTUAL_INTEGRITY`): genuine software on
    /// no real device, the tool of device farms.
    Virtual,
    /// Basic integrity (possibly rooted).
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
            Level::Virtual => "virtual",
            Level::Basic => "basic",
            Level::Device => "device",
            Level::Strong => "strong",
        }
    }

    fn parse(text: &str) -> Level {
        match text {
            "failed" => Level::Failed,
            "virtual" => Level::Virtual,
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
    /// The device id belongs to another platform or another App Attest key.
    #[error("device bound: {0}")]
    DeviceBound(String),
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
            Rejection::DeviceBound(_) => "device_bound",
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
                decryption: encoding::decode_key(decryption.expose(), 32).unwrap_or_default(),
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
            .filter_map(|d| encoding::decode_digest(d))
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
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len() / 2)
        .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
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
