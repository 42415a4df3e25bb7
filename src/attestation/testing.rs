//! Makers of Play Integrity tokens and App Attest assertions with your own keys, for tests
//! and benchmarks of integrations (Palisade's own use them; production code never does).
//!
//! They produce what Google and Apple produce, so the verifiers can be exercised end to end
//! without a device: a JWS signed with an ES256 key, sealed as a JWE with an A256KW key, and
//! a CBOR assertion signed with a P-256 key.

use aes_kw::KeyInit;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::EcdsaKeyPair;
use sha2::{Digest, Sha256};

/// `base64url(header).base64url(payload).base64url(ES256 signature)` with `key` (a ring
/// key pair for `ECDSA_P256_SHA256_FIXED_SIGNING`).
pub fn sign_jws(
    header: &serde_json::Value,
    payload: &serde_json::Value,
    key: &EcdsaKeyPair,
) -> String {
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(payload.to_string())
    );
    let signature = key
        .sign(&SystemRandom::new(), signed.as_bytes())
        .expect("signing with a valid key pair");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
}

/// Seals `plaintext` as a compact JWE with `header` (normally `{"alg":"A256KW",
/// "enc":"A256GCM"}`), wrapping a fresh content key with `kek` (32 bytes).
pub fn seal_jwe(header: &serde_json::Value, plaintext: &str, kek: &[u8; 32]) -> String {
    let rng = SystemRandom::new();
    let protected = URL_SAFE_NO_PAD.encode(header.to_string());
    let mut cek = [0u8; 32];
    let mut iv = [0u8; 12];
    rng.fill(&mut cek).expect("system randomness");
    rng.fill(&mut iv).expect("system randomness");
    let mut wrapped = [0u8; 40];
    aes_kw::KwAes256::new_from_slice(kek)
        .expect("a 32-byte key")
        .wrap_key(&cek, &mut wrapped)
        .expect("40 bytes hold a wrapped 32-byte key");
    let key = ring::aead::LessSafeKey::new(
        ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &cek).expect("a 32-byte key"),
    );
    let mut data = plaintext.as_bytes().to_vec();
    let tag = key
        .seal_in_place_separate_tag(
            ring::aead::Nonce::assume_unique_for_key(iv),
            ring::aead::Aad::from(protected.as_bytes()),
            &mut data,
        )
        .expect("sealing");
    format!(
        "{protected}.{}.{}.{}.{}",
        URL_SAFE_NO_PAD.encode(wrapped),
        URL_SAFE_NO_PAD.encode(iv),
        URL_SAFE_NO_PAD.encode(&data),
        URL_SAFE_NO_PAD.encode(tag.as_ref())
    )
}

/// A Play Integrity token for `payload`, as Google would issue it with these keys.
pub fn play_integrity_token(
    payload: &serde_json::Value,
    kek: &[u8; 32],
    key: &EcdsaKeyPair,
) -> String {
    let jws = sign_jws(&serde_json::json!({"alg": "ES256"}), payload, key);
    seal_jwe(
        &serde_json::json!({"alg": "A256KW", "enc": "A256GCM"}),
        &jws,
        kek,
    )
}

/// A CBOR App Attest assertion by `key` (a ring key pair for
/// `ECDSA_P256_SHA256_ASN1_SIGNING`) for `app_id`, over the client data `client_data`, with
/// the sign counter `counter`.
pub fn app_attest_assertion(
    key: &EcdsaKeyPair,
    app_id: &str,
    client_data: &[u8],
    counter: u32,
) -> Vec<u8> {
    let mut auth = Sha256::digest(app_id.as_bytes()).to_vec();
    auth.push(0x00);
    auth.extend(counter.to_be_bytes());
    let nonce = Sha256::new()
        .chain_update(&auth)
        .chain_update(Sha256::digest(client_data))
        .finalize();
    let signature = key
        .sign(&SystemRandom::new(), &nonce)
        .expect("signing with a valid key pair");
    let object = ciborium::Value::Map(vec![
        (
            "signature".into(),
            ciborium::Value::Bytes(signature.as_ref().to_vec()),
        ),
        ("authenticatorData".into(), ciborium::Value::Bytes(auth)),
    ]);
    let mut bytes = Vec::new();
    ciborium::into_writer(&object, &mut bytes).expect("writing to a Vec");
    bytes
}
