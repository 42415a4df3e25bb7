//! The text forms of attestation keys and digests.
//!
//! As the Play Console gives them and devices send them: base64 in any alphabet, digests in
//! hex or base64, a P-256 public key's point from its DER `SubjectPublicKeyInfo`. The
//! settings are checked with them when they load; the attestation service reads its settings
//! and submissions with them.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

/// Base64 in any of its common forms (standard or URL-safe, padded or not).
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    [&URL_SAFE_NO_PAD, &URL_SAFE, &STANDARD, &STANDARD_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
}

/// A key of exactly `len` bytes from base64.
pub fn decode_key(text: &str, len: usize) -> Option<Vec<u8>> {
    decode_base64(text).filter(|k| k.len() == len)
}

/// A SHA-256 digest from hex or base64.
pub fn decode_digest(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    let hex = text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit());
    if hex {
        return (0..32)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
            .collect();
    }
    decode_base64(text).filter(|d| d.len() == 32)
}

/// The uncompressed point of an EC P-256 key given as the base64 of its DER
/// SubjectPublicKeyInfo (the Play Console's verification key).
pub fn p256_spki_point(text: &str) -> Option<Vec<u8>> {
    use x509_parser::prelude::FromDer;
    let der = decode_base64(text)?;
    let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&der).ok()?;
    let p256 = x509_parser::oid_registry::OID_EC_P256;
    let curve = spki.algorithm.parameters.as_ref()?.as_oid().ok()?;
    (curve == p256 && spki.subject_public_key.data.len() == 65)
        .then(|| spki.subject_public_key.data.to_vec())
}
