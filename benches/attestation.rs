//! Attestation verifications per second: a Play Integrity token (A256KW unwrap, AES-256-GCM,
//! ES256, verdict checks) and an App Attest assertion (CBOR, ECDSA P-256, counter), each
//! against the bare signature verification it is built on, in the same run.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use palisade::attestation::{app_attest, play_integrity, testing};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair};
use sha2::{Digest, Sha256};

const APP_ID: &str = "ABCDE12345.com.example.app";

fn key(alg: &'static signature::EcdsaSigningAlgorithm) -> (EcdsaKeyPair, Vec<u8>) {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let public = pair.public_key().as_ref().to_vec();
    (pair, public)
}

/// Play Integrity token → verified, checked verdict; vs one ES256 verification.
pub fn play_integrity(c: &mut Criterion) {
    let (signing, public) = key(&signature::ECDSA_P256_SHA256_FIXED_SIGNING);
    let spki = spki_of(&public);
    let keys = play_integrity::Keys {
        decryption: vec![9; 32],
        verification: play_integrity::VerificationKey::from_base64(&spki).expect("P-256 SPKI"),
    };
    let now = 1_800_000_000_000_i64;
    let payload = serde_json::json!({
        "requestDetails": {"requestPackageName": "com.example.app", "timestampMillis": now.to_string(), "nonce": "challenge-1"},
        "appIntegrity": {"appRecognitionVerdict": "PLAY_RECOGNIZED", "packageName": "com.example.app"},
        "deviceIntegrity": {"deviceRecognitionVerdict": ["MEETS_STRONG_INTEGRITY"]},
        "accountDetails": {"appLicensingVerdict": "LICENSED"},
    });
    let token = testing::play_integrity_token(&payload, &[9; 32], &signing);
    let packages = vec!["com.example.app".to_owned()];
    let expected = play_integrity::Expected {
        package_names: &packages,
        certificate_digests: &[],
        challenge: "challenge-1",
        max_age_ms: 300_000,
        now_ms: now,
        require_licensed: false,
    };
    let jws = testing::sign_jws(&serde_json::json!({"alg": "ES256"}), &payload, &signing);
    let (signed, sig) = jws.rsplit_once('.').unwrap();
    let sig = palisade::model::encoding::decode_base64(sig).unwrap();
    let mut group = c.benchmark_group("attestation/play_integrity");
    group.throughput(Throughput::Elements(1));
    group.bench_function("palisade: token decrypted, verified, evaluated", |b| {
        b.iter(|| {
            let verdict = play_integrity::decrypt_and_verify(black_box(&token), &keys).unwrap();
            play_integrity::evaluate(&verdict, &expected).unwrap()
        })
    });
    group.bench_function("baseline: one ES256 verification (ring)", |b| {
        b.iter(|| {
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &public)
                .verify(black_box(signed.as_bytes()), &sig)
                .unwrap()
        })
    });
    group.finish();
}

/// App Attest assertion → counter; vs one ECDSA P-256 (DER) verification.
pub fn app_attest_assertion(c: &mut Criterion) {
    let (signing, public) = key(&signature::ECDSA_P256_SHA256_ASN1_SIGNING);
    let assertion = testing::app_attest_assertion(&signing, APP_ID, b"challenge-1", 7);
    let client_data_hash = Sha256::digest(b"challenge-1");
    let app_ids = vec![APP_ID.to_owned()];
    let nonce = Sha256::digest(b"bench");
    let sig = signing.sign(&SystemRandom::new(), &nonce).unwrap();
    let mut group = c.benchmark_group("attestation/app_attest_assertion");
    group.throughput(Throughput::Elements(1));
    group.bench_function("palisade: assertion verified", |b| {
        b.iter(|| {
            app_attest::verify_assertion(
                black_box(&assertion),
                &client_data_hash,
                &public,
                &app_ids,
                6,
            )
            .unwrap()
        })
    });
    group.bench_function("baseline: one ECDSA P-256 verification (ring)", |b| {
        b.iter(|| {
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, &public)
                .verify(black_box(&nonce), sig.as_ref())
                .unwrap()
        })
    });
    group.finish();
}

/// base64 of the DER SubjectPublicKeyInfo of an uncompressed P-256 point.
fn spki_of(point: &[u8]) -> String {
    use base64::Engine as _;
    // SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING point }: the fixed
    // 26-byte prefix of every P-256 SPKI.
    let mut der = vec![
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    der.extend_from_slice(point);
    base64::engine::general_purpose::STANDARD.encode(der)
}
