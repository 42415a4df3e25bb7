//! `[attestation]`: challenges, Play Integrity and App Attest verification, verdict factors.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Secret, SettingError, setting_name};
use crate::model::encoding;

/// The verdict levels, strongest first.
pub const LEVELS: [&str; 6] = [
    "strong",
    "device",
    "basic",
    "virtual",
    "failed",
    "unverified",
];

/// `[attestation.play_integrity]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlayIntegritySettings {
    /// Package names of the app (`requestDetails.requestPackageName` and
    /// `appIntegrity.packageName` must be one). Empty: Play Integrity is off.
    pub package_names: Vec<String>,
    /// SHA-256 digests of the app's signing certificates, hex or base64(url) as in
    /// `appIntegrity.certificateSha256Digest`; one must match. Empty: not checked.
    pub certificate_sha256: Vec<String>,
    /// The Play Console's response decryption key (base64 of 32 bytes, AES-256 for A256KW).
    /// Unset: only decoded verdicts are accepted.
    pub decryption_key: Option<Secret>,
    /// The Play Console's response verification key (base64 of an EC P-256
    /// SubjectPublicKeyInfo, for ES256).
    pub verification_key: Option<String>,
    /// Oldest `requestDetails.timestampMillis` accepted, seconds. Default 300.
    pub max_age_s: u64,
    /// An `UNLICENSED` app licensing verdict fails the device (else it caps it at `basic`).
    /// Default false.
    pub require_licensed: bool,
    /// Accept verdicts the caller decoded with Google's `decodeIntegrityToken`: unsigned, so
    /// anyone holding an ingest token could write one by hand. Default false; refused whenever
    /// the local verification keys are configured. When on, a decoded verdict is checked the
    /// same way, capped below `strong`, marked `decoded_by_caller`, and never replaces an
    /// unexpired verified verdict of the device.
    pub accept_decoded: bool,
}

/// `[attestation.app_attest]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AppAttestSettings {
    /// App ids, `TEAMID.bundle.id`; the RP ID hash must be the SHA-256 of one. Empty: App
    /// Attest is off.
    pub app_ids: Vec<String>,
    /// `production` (aaguid `appattest` + 7 zero bytes) or `development`
    /// (`appattestdevelop`). Default `production`.
    pub environment: AppAttestEnvironment,
    /// PEM file of the App Attestation Root CA to trust. Default: Apple's, built in (never
    /// fetched).
    pub root_ca: Option<PathBuf>,
}

/// Which App Attest environment the apps run in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AppAttestEnvironment {
    /// App Store / TestFlight builds.
    #[default]
    Production,
    /// Development builds.
    Development,
}

/// The `[attestation]` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttestationSettings {
    /// Lifetime of an issued challenge, seconds. TOML `attestation.challenge_ttl_s`; default
    /// 300.
    pub challenge_ttl_s: u64,
    /// How long a verdict counts before the device must attest again, seconds (an App Attest
    /// assertion renews it). Default 86400.
    pub verdict_ttl_s: u64,
    /// Factor per verdict level on classes that are not public. Defaults: strong 1.5,
    /// device 1.0, basic 1.0, virtual 1.0, failed 0.5, unverified 1.0.
    pub factors: BTreeMap<String, f64>,
    /// Factor per verdict level on public classes (`scoring.public_classes`). Defaults:
    /// strong 1.5, device 1.0, basic 0.75, virtual 0.5 (an emulator Google Play vouches
    /// for), failed 0.25, unverified 0.25. `unverified` may
    /// not exceed `failed`: a failed device would present a new id instead.
    pub public_factors: BTreeMap<String, f64>,
    /// Play Integrity.
    pub play_integrity: PlayIntegritySettings,
    /// App Attest.
    pub app_attest: AppAttestSettings,
}

impl Default for AttestationSettings {
    fn default() -> Self {
        let levels = |values: [f64; 6]| {
            LEVELS
                .iter()
                .zip(values)
                .map(|(l, v)| ((*l).to_owned(), v))
                .collect()
        };
        Self {
            challenge_ttl_s: 300,
            verdict_ttl_s: 86_400,
            factors: levels([1.5, 1.0, 1.0, 1.0, 0.5, 1.0]),
            public_factors: levels([1.5, 1.0, 0.75, 0.5, 0.25, 0.25]),
            play_integrity: PlayIntegritySettings {
                max_age_s: 300,
                accept_decoded: false,
                ..PlayIntegritySettings::default()
            },
            app_attest: AppAttestSettings::default(),
        }
    }
}

impl AttestationSettings {
    /// The factor of `level` (`public`: on a public class).
    pub fn factor(&self, level: &str, public: bool) -> f64 {
        let table = if public {
            &self.public_factors
        } else {
            &self.factors
        };
        table.get(level).copied().unwrap_or(1.0)
    }

    pub(super) fn validate(&self) -> Result<(), SettingError> {
        if self.challenge_ttl_s == 0 || self.verdict_ttl_s == 0 {
            return Err(SettingError::new(
                setting_name("attestation.challenge_ttl_s"),
                "challenge_ttl_s and verdict_ttl_s must be at least 1",
            ));
        }
        for (name, table) in [
            ("attestation.factors", &self.factors),
            ("attestation.public_factors", &self.public_factors),
        ] {
            for level in LEVELS {
                match table.get(level) {
                    Some(f) if (0.0..=10.0).contains(f) => {}
                    _ => {
                        return Err(SettingError::new(
                            format!("{name}.{level}"),
                            "must be set, between 0 and 10",
                        ));
                    }
                }
            }
            if let Some(other) = table.keys().find(|k| !LEVELS.contains(&k.as_str())) {
                return Err(SettingError::new(
                    format!("{name}.{other}"),
                    "is not a verdict level (strong, device, basic, virtual, failed, unverified)",
                ));
            }
        }
        if self.factor("unverified", true) > self.factor("failed", true) {
            return Err(SettingError::new(
                "attestation.public_factors.unverified",
                "must not exceed public_factors.failed: a device that failed attestation \
                 would present a never-seen device id instead",
            ));
        }
        let play = &self.play_integrity;
        if play.max_age_s == 0 {
            return Err(SettingError::new(
                setting_name("attestation.play_integrity.max_age_s"),
                "must be at least 1",
            ));
        }
        if let Some(key) = &play.decryption_key
            && encoding::decode_key(key.expose(), 32).is_none()
        {
            return Err(SettingError::new(
                setting_name("attestation.play_integrity.decryption_key"),
                "must be the base64 of 32 bytes (the Play Console's decryption key)",
            ));
        }
        if let Some(key) = &play.verification_key
            && encoding::p256_spki_point(key).is_none()
        {
            return Err(SettingError::new(
                setting_name("attestation.play_integrity.verification_key"),
                "must be the base64 of an EC P-256 SubjectPublicKeyInfo (the Play Console's verification key)",
            ));
        }
        if play.decryption_key.is_some() != play.verification_key.is_some() {
            return Err(SettingError::new(
                setting_name("attestation.play_integrity.decryption_key"),
                "decryption_key and verification_key are set together",
            ));
        }
        if let Some(digest) = play
            .certificate_sha256
            .iter()
            .find(|d| encoding::decode_digest(d).is_none())
        {
            return Err(SettingError::new(
                setting_name("attestation.play_integrity.certificate_sha256"),
                format!("{digest:?} is not a SHA-256 digest in hex or base64"),
            ));
        }
        let apple = &self.app_attest;
        if let Some(bad) = apple.app_ids.iter().find(|id| {
            id.split_once('.')
                .is_none_or(|(team, bundle)| team.len() != 10 || bundle.is_empty())
        }) {
            return Err(SettingError::new(
                setting_name("attestation.app_attest.app_ids"),
                format!("{bad:?} is not TEAMID.bundle.id (a 10-character team id)"),
            ));
        }
        Ok(())
    }
}
