//! Play Integrity tokens (JWE compact → JWS compact → JSON) and verdict payloads: arbitrary
//! input is rejected with a reason, never a panic, never a verdict.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade::attestation::play_integrity::{
    Expected, Keys, VerificationKey, decrypt_and_verify, evaluate, verify_jws,
};

/// base64 of the DER SubjectPublicKeyInfo of the P-256 generator point.
const SPKI: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEaxfR8uEsQkf4vOblY6RA8ncDfYEt6zOg9KE5RdiYwpZP40Li/hp/m47n60p8D54WK84zV2sxXs7LtkBoN79R9Q==";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let verification = VerificationKey::from_base64(SPKI).expect("a P-256 key");
    let keys = Keys {
        decryption: vec![3; 32],
        verification: verification.clone(),
    };
    assert!(decrypt_and_verify(text, &keys).is_err());
    assert!(verify_jws(text, &verification).is_err());
    if let Ok(payload) = serde_json::from_str::<serde_json::Value>(text) {
        let packages = ["com.example.app".to_owned()];
        let expected = Expected {
            package_names: &packages,
            certificate_digests: &[],
            challenge: "challenge",
            max_age_ms: 300_000,
            now_ms: 1_800_000_000_000,
            require_licensed: false,
        };
        let _ = evaluate(&payload, &expected);
    }
});
