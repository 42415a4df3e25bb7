//! Google Play Integrity: the integrity token decrypted and verified locally, and the
//! verdict checked against the app's settings.
//!
//! A token is a JWE (compact, `A256KW` + `A256GCM`) whose plaintext is a JWS (compact,
//! `ES256`) whose payload is the verdict JSON
//! (<https://developer.android.com/google/play/integrity/classic#decrypt-verify>). The AES key
//! wrap is `aes-kw`, AES-GCM and ECDSA are `ring`; nothing here is a hand-written primitive.
//! [`decrypt_and_verify`] and [`evaluate`] are pure: keys, the expected values and `now` are
//! parameters.

use aes_kw::KeyInit;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead;
use ring::signature::{self, UnparsedPublicKey};
use serde_json::Value;

use super::{Level, Rejection};
use crate::model::Reason;

use crate::model::encoding::{decode_digest, p256_spki_point};

/// The Play Console's verification key: an uncompressed P-256 point.
#[derive(Clone, PartialEq, Eq)]
pub struct VerificationKey(Vec<u8>);

impl std::fmt::Debug for VerificationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VerificationKey(P-256)")
    }
}

impl VerificationKey {
    /// From the base64 of a DER SubjectPublicKeyInfo of an EC P-256 key.
    pub fn from_base64(text: &str) -> Option<Self> {
        p256_spki_point(text).map(Self)
    }
}

/// The keys of one app from the Play Console.
#[derive(Debug, Clone)]
pub struct Keys {
    /// AES-256 key encryption key (A256KW).
    pub decryption: Vec<u8>,
    /// ES256 verification key.
    pub verification: VerificationKey,
}

fn part(text: &str, what: &str) -> Result<Vec<u8>, Rejection> {
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| Rejection::Malformed(format!("the token's {what} is not base64url")))
}

fn header(text: &str, what: &str) -> Result<Value, Rejection> {
    serde_json::from_slice(&part(text, what)?)
        .map_err(|_| Rejection::Malformed(format!("the token's {what} is not JSON")))
}

/// Decrypts the JWE and verifies the inner JWS; returns the verdict payload.
pub fn decrypt_and_verify(token: &str, keys: &Keys) -> Result<Value, Rejection> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    let [protected, wrapped, iv, ciphertext, tag] = parts[..] else {
        return Err(Rejection::Malformed(format!(
            "an integrity token has 5 dot-separated parts (JWE compact), this one {}",
            parts.len()
        )));
    };
    let jwe = header(protected, "JWE header")?;
    let (alg, enc) = (jwe["alg"].as_str(), jwe["enc"].as_str());
    if alg != Some("A256KW") || enc != Some("A256GCM") {
        return Err(Rejection::UnsupportedAlgorithm(format!(
            "JWE alg {alg:?} enc {enc:?}; only A256KW with A256GCM is accepted"
        )));
    }
    let wrapped = part(wrapped, "encrypted key")?;
    let kek = aes_kw::KwAes256::new_from_slice(&keys.decryption)
        .map_err(|_| Rejection::NotConfigured("attestation.play_integrity.decryption_key"))?;
    let mut cek = [0u8; 32];
    if wrapped.len() != 40 || kek.unwrap_key(&wrapped, &mut cek).is_err() {
        return Err(Rejection::DecryptionFailed(
            "the content key does not unwrap with the decryption key".to_owned(),
        ));
    }
    let iv = part(iv, "IV")?;
    let nonce = aead::Nonce::try_assume_unique_for_key(&iv)
        .map_err(|_| Rejection::Malformed("the IV is not 96 bits".to_owned()))?;
    let key = aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::AES_256_GCM, &cek)
            .map_err(|_| Rejection::DecryptionFailed("bad content key".to_owned()))?,
    );
    let mut sealed = part(ciphertext, "ciphertext")?;
    sealed.extend(part(tag, "tag")?);
    // The additional data is the protected header exactly as sent (RFC 7516 §5.1).
    let plaintext = key
        .open_in_place(nonce, aead::Aad::from(protected.as_bytes()), &mut sealed)
        .map_err(|_| {
            Rejection::DecryptionFailed(
                "the ciphertext or its tag was altered (AES-GCM authentication failed)".to_owned(),
            )
        })?;
    let jws = std::str::from_utf8(plaintext)
        .map_err(|_| Rejection::Malformed("the decrypted token is not text".to_owned()))?;
    verify_jws(jws, &keys.verification)
}

/// Verifies a compact ES256 JWS; returns its payload.
pub fn verify_jws(jws: &str, key: &VerificationKey) -> Result<Value, Rejection> {
    let parts: Vec<&str> = jws.trim().split('.').collect();
    let [protected, payload, signature] = parts[..] else {
        return Err(Rejection::Malformed(
            "the decrypted token is not a JWS (3 dot-separated parts)".to_owned(),
        ));
    };
    let alg = header(protected, "JWS header")?;
    if alg["alg"].as_str() != Some("ES256") {
        return Err(Rejection::UnsupportedAlgorithm(format!(
            "JWS alg {:?}; only ES256 is accepted",
            alg["alg"].as_str()
        )));
    }
    let signature = part(signature, "signature")?;
    let signed = &jws.trim()[..protected.len() + 1 + payload.len()];
    UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &key.0)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| {
            Rejection::SignatureInvalid("the verdict's ES256 signature does not verify".to_owned())
        })?;
    serde_json::from_slice(&part(payload, "payload")?)
        .map_err(|_| Rejection::Malformed("the verdict payload is not JSON".to_owned()))
}

/// What a verdict must match.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// Allowed package names.
    pub package_names: &'a [String],
    /// Allowed signing-certificate digests (empty: not checked).
    pub certificate_digests: &'a [Vec<u8>],
    /// The challenge issued for this attestation (the request's nonce or request hash).
    pub challenge: &'a str,
    /// Oldest timestamp accepted, ms.
    pub max_age_ms: i64,
    /// Now, Unix ms.
    pub now_ms: i64,
    /// UNLICENSED fails the device.
    pub require_licensed: bool,
}

fn number(value: &Value) -> Option<i64> {
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
}

/// Checks a verdict payload against what the request must match.
///
/// A mismatch with the request (package, challenge, freshness, signing certificate) is a
/// [`Rejection`]; what Google says about the app and device is the level, with a reason per
/// verdict.
pub fn evaluate(
    payload: &Value,
    expected: &Expected<'_>,
) -> Result<(Level, Vec<Reason>), Rejection> {
    let request = &payload["requestDetails"];
    let package = request["requestPackageName"].as_str().unwrap_or_default();
    if !expected.package_names.iter().any(|p| p == package) {
        return Err(Rejection::PackageMismatch(format!(
            "requestPackageName {package:?} is not one of the configured packages"
        )));
    }
    let nonce = request["nonce"]
        .as_str()
        .or_else(|| request["requestHash"].as_str());
    if nonce != Some(expected.challenge) {
        return Err(Rejection::NonceMismatch(
            "the verdict's nonce/requestHash is not the challenge issued for this device"
                .to_owned(),
        ));
    }
    let Some(ts) = number(&request["timestampMillis"]) else {
        return Err(Rejection::Malformed(
            "requestDetails.timestampMillis is missing".to_owned(),
        ));
    };
    // Saturating: a hostile timestampMillis (e.g. i64::MIN) must be stale, not an overflow.
    let age = expected.now_ms.saturating_sub(ts);
    if age > expected.max_age_ms || age < -60_000 {
        return Err(Rejection::StaleTimestamp(format!(
            "the verdict is {} s old (at most {} s)",
            age / 1000,
            expected.max_age_ms / 1000
        )));
    }
    let app = &payload["appIntegrity"];
    if let Some(name) = app["packageName"].as_str()
        && name != package
    {
        return Err(Rejection::PackageMismatch(format!(
            "appIntegrity.packageName {name:?} differs from the requesting package"
        )));
    }
    if !expected.certificate_digests.is_empty()
        && let Some(digests) = app["certificateSha256Digest"].as_array()
    {
        let matches = digests
            .iter()
            .filter_map(|d| d.as_str().and_then(decode_digest))
            .any(|d| expected.certificate_digests.contains(&d));
        if !matches {
            return Err(Rejection::CertificateDigestMismatch(
                "no certificateSha256Digest matches the app's signing certificates".to_owned(),
            ));
        }
    }

    let mut reasons = Vec::new();
    // Only the verdict strings Google defines are kept (and echoed in reasons): anything
    // else is `UNKNOWN`, however long.
    let recognition = known(
        app["appRecognitionVerdict"]
            .as_str()
            .unwrap_or("UNEVALUATED"),
        &["PLAY_RECOGNIZED", "UNRECOGNIZED_VERSION", "UNEVALUATED"],
    );
    if recognition == "PLAY_RECOGNIZED" {
        // Google fills both for a recognised app: a verdict without them is not one.
        let digests = app["certificateSha256Digest"].as_array();
        if app["packageName"].as_str().is_none() || digests.is_none_or(Vec::is_empty) {
            return Err(Rejection::Malformed(
                "a PLAY_RECOGNIZED verdict without appIntegrity.packageName and \
                 certificateSha256Digest"
                    .to_owned(),
            ));
        }
    }
    let mut device: Vec<&str> = payload["deviceIntegrity"]["deviceRecognitionVerdict"]
        .as_array()
        .map(|v| {
            v.iter()
                .take(8)
                .filter_map(Value::as_str)
                .map(|text| known(text, DEVICE_VERDICTS))
                .collect()
        })
        .unwrap_or_default();
    device.dedup();
    let mut level = if device.contains(&"MEETS_STRONG_INTEGRITY") {
        Level::Strong
    } else if device.contains(&"MEETS_DEVICE_INTEGRITY") {
        Level::Device
    } else if device.contains(&"MEETS_BASIC_INTEGRITY") {
        Level::Basic
    } else if device.contains(&"MEETS_VIRTUAL_INTEGRITY") {
        reasons.push(Reason::new(
            "device_virtual",
            "an emulator Google Play vouches for (MEETS_VIRTUAL_INTEGRITY)",
        ));
        Level::Virtual
    } else {
        reasons.push(Reason::new(
            "device_integrity_not_met",
            "the device meets no integrity level",
        ));
        Level::Failed
    };
    if level != Level::Failed {
        reasons.push(Reason::new(
            "device_integrity",
            format!("deviceRecognitionVerdict {}", device.join(", ")),
        ));
    }
    if recognition != "PLAY_RECOGNIZED" {
        reasons.push(Reason::new(
            "app_not_recognized",
            format!("appRecognitionVerdict {recognition}: not the app as published on Google Play"),
        ));
        level = Level::Failed;
    }
    match payload["accountDetails"]["appLicensingVerdict"].as_str() {
        Some("LICENSED") => reasons.push(Reason::new("app_licensed", "LICENSED")),
        Some("UNLICENSED") if expected.require_licensed => {
            reasons.push(Reason::new(
                "app_unlicensed",
                "UNLICENSED: the user did not get the app from Google Play",
            ));
            level = Level::Failed;
        }
        Some("UNLICENSED") => {
            reasons.push(Reason::new("app_unlicensed", "UNLICENSED: capped at basic"));
            level = level.min(Level::Basic);
        }
        other => reasons.push(Reason::new(
            "licensing_unevaluated",
            format!(
                "appLicensingVerdict {}",
                other.map_or("absent", |text| known(text, &["UNEVALUATED"]))
            ),
        )),
    }
    Ok((level, reasons))
}

/// The device recognition verdicts Google defines.
const DEVICE_VERDICTS: &[&str] = &[
    "MEETS_STRONG_INTEGRITY",
    "MEETS_DEVICE_INTEGRITY",
    "MEETS_BASIC_INTEGRITY",
    "MEETS_VIRTUAL_INTEGRITY",
];

/// `text` if it is one of `set`, else `UNKNOWN`.
fn known(text: &str, set: &[&'static str]) -> &'static str {
    set.iter()
        .find(|k| **k == text)
        .copied()
        .unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    static PACKAGES: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| vec!["com.example.app".to_owned()]);

    /// What the test app `com.example.app` expects of a verdict for challenge `c` at
    /// 1 800 000 000 000 ms.
    fn expected() -> Expected<'static> {
        Expected {
            package_names: &PACKAGES,
            certificate_digests: &[],
            challenge: "c",
            max_age_ms: 300_000,
            now_ms: 1_800_000_000_000,
            require_licensed: false,
        }
    }

    #[test]
    fn verdict_strings_are_kept_only_from_the_defined_set() {
        let expected = expected();
        let huge = "X".repeat(100_000);
        let payload = serde_json::json!({
            "requestDetails": {"requestPackageName": "com.example.app", "nonce": "c",
                               "timestampMillis": "1800000000000"},
            "appIntegrity": {"appRecognitionVerdict": huge, "packageName": "com.example.app"},
            "deviceIntegrity": {"deviceRecognitionVerdict": [huge, "MEETS_DEVICE_INTEGRITY"]},
            "accountDetails": {"appLicensingVerdict": huge},
        });
        let (level, reasons) = evaluate(&payload, &expected).unwrap();
        assert_eq!(level, Level::Failed, "not recognised");
        let text = serde_json::to_string(&reasons).unwrap();
        assert!(text.len() < 1000, "{text}");
        assert!(text.contains("UNKNOWN"), "{text}");
    }

    #[test]
    fn a_recognised_app_without_package_or_digest_is_malformed() {
        let expected = expected();
        let payload = serde_json::json!({
            "requestDetails": {"requestPackageName": "com.example.app", "nonce": "c",
                               "timestampMillis": "1800000000000"},
            "appIntegrity": {"appRecognitionVerdict": "PLAY_RECOGNIZED"},
            "deviceIntegrity": {"deviceRecognitionVerdict": ["MEETS_STRONG_INTEGRITY"]},
        });
        assert!(matches!(
            evaluate(&payload, &expected),
            Err(Rejection::Malformed(_))
        ));
    }

    #[test]
    fn extreme_timestamps_are_stale_not_an_overflow() {
        let expected = expected();
        for ts in [i64::MIN.to_string(), i64::MAX.to_string()] {
            let payload = serde_json::json!({"requestDetails": {"requestPackageName": "com.example.app",
                "nonce": "c", "timestampMillis": ts}});
            let err = evaluate(&payload, &expected).unwrap_err();
            assert_eq!(err.code(), "stale_timestamp", "{ts}");
        }
    }
}
