//! App Attest attestation objects and assertions (CBOR, X.509, DER): arbitrary bytes are
//! rejected with a reason, never a panic, and never accepted against Apple's real root.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use palisade::attestation::app_attest::{verify_assertion, verify_attestation};
use palisade::config::AppAttestEnvironment;

static ROOT: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let text = std::str::from_utf8(palisade::attestation::APPLE_ROOT_PEM).unwrap();
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::Engine::decode(&base64::engine::general_purpose::STANDARD, body).unwrap()
});

/// A valid uncompressed P-256 point (the generator), as a stored App Attest key would be.
const P256_G: [u8; 65] = [
    0x04, 0x6b, 0x17, 0xd1, 0xf2, 0xe1, 0x2c, 0x42, 0x47, 0xf8, 0xbc, 0xe6, 0xe5, 0x63, 0xa4,
    0x40, 0xf2, 0x77, 0x03, 0x7d, 0x81, 0x2d, 0xeb, 0x33, 0xa0, 0xf4, 0xa1, 0x39, 0x45, 0xd8,
    0x98, 0xc2, 0x96, 0x4f, 0xe3, 0x42, 0xe2, 0xfe, 0x1a, 0x7f, 0x9b, 0x8e, 0xe7, 0xeb, 0x4a,
    0x7c, 0x0f, 0x9e, 0x16, 0x2b, 0xce, 0x33, 0x57, 0x6b, 0x31, 0x5e, 0xce, 0xcb, 0xb6, 0x40,
    0x68, 0x37, 0xbf, 0x51, 0xf5,
];

fuzz_target!(|data: &[u8]| {
    let app_ids = ["ABCDE12345.com.example.app".to_owned()];
    let key_id = [7u8; 32];
    let hash = [9u8; 32];
    let attested = verify_attestation(
        data,
        &key_id,
        &hash,
        &app_ids,
        AppAttestEnvironment::Production,
        &ROOT,
        1_700_000_000,
    );
    assert!(attested.is_err(), "random bytes attested against Apple's root");
    let _ = verify_assertion(data, &hash, &P256_G, &app_ids, 0);
});
