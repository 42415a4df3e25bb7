//! App Attest: attestation objects and assertions made with test keys, each check failing on its own.

use super::*;

on_both_backends!(
    app_attest_attestation_and_assertions_verify,
    each_app_attest_check_fails_on_its_own,
);

pub(super) fn app_key() -> AppKey {
    let rng = SystemRandom::new();
    let pkcs8 =
        EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .unwrap();
    let key_id = Sha256::digest(pair.public_key().as_ref()).to_vec();
    AppKey {
        rcgen: rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap(),
        pair,
        key_id,
    }
}

/// How to spoil an attestation object.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Bad {
    None,
    OtherCa,
    OtherAppId,
    OtherChallenge,
    Counter,
    Development,
}

pub(super) fn attestation_object(key: &AppKey, challenge: &str, f: &Fixtures, bad: Bad) -> String {
    let app_id = if bad == Bad::OtherAppId {
        "ABCDE12345.com.evil.clone"
    } else {
        APP_ID
    };
    let mut auth = Sha256::digest(app_id.as_bytes()).to_vec();
    auth.push(0x40);
    auth.extend(if bad == Bad::Counter { 7u32 } else { 0 }.to_be_bytes());
    auth.extend(if bad == Bad::Development {
        *b"appattestdevelop"
    } else {
        *b"appattest\0\0\0\0\0\0\0"
    });
    auth.extend(32u16.to_be_bytes());
    auth.extend(&key.key_id);
    auth.extend([0xa0]); // an (empty) COSE key map: the key comes from the certificate
    let signed_challenge = if bad == Bad::OtherChallenge {
        "some other challenge"
    } else {
        challenge
    };
    let nonce = Sha256::new()
        .chain_update(&auth)
        .chain_update(Sha256::digest(signed_challenge.as_bytes()))
        .finalize();
    // SEQUENCE { [1] { OCTET STRING nonce } }
    let mut extension = vec![0x30, 36, 0xa1, 34, 0x04, 32];
    extension.extend(nonce);
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "credential");
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            &[1, 2, 840, 113635, 100, 8, 2],
            extension,
        ));
    let stranger;
    let issuer = if bad == Bad::OtherCa {
        stranger = Fixtures::new();
        &stranger.intermediate
    } else {
        &f.intermediate
    };
    let leaf = params.signed_by(&key.rcgen, issuer).unwrap();
    let statement = ciborium::Value::Map(vec![
        (
            "x5c".into(),
            ciborium::Value::Array(vec![
                ciborium::Value::Bytes(leaf.der().to_vec()),
                ciborium::Value::Bytes(issuer.der().to_vec()),
            ]),
        ),
        (
            "receipt".into(),
            ciborium::Value::Bytes(b"test receipt".to_vec()),
        ),
    ]);
    let object = ciborium::Value::Map(vec![
        ("fmt".into(), "apple-appattest".into()),
        ("attStmt".into(), statement),
        ("authData".into(), ciborium::Value::Bytes(auth)),
    ]);
    let mut bytes = Vec::new();
    ciborium::into_writer(&object, &mut bytes).unwrap();
    STANDARD.encode(bytes)
}

pub(super) fn assertion(key: &AppKey, challenge: &str, counter: u32, tamper: bool) -> String {
    let mut bytes = palisade::attestation::testing::app_attest_assertion(
        &key.pair,
        APP_ID,
        challenge.as_bytes(),
        counter,
    );
    if tamper {
        // The signature's last byte sits well inside the CBOR map; flipping a bit there
        // keeps it DER-shaped but wrong.
        let value: ciborium::Value = ciborium::from_reader(&bytes[..]).unwrap();
        let mut map = value.into_map().unwrap();
        if let Some((_, ciborium::Value::Bytes(sig))) = map
            .iter_mut()
            .find(|(k, _)| k.as_text() == Some("signature"))
        {
            let last = sig.len() - 1;
            sig[last] ^= 1;
        }
        bytes.clear();
        ciborium::into_writer(&ciborium::Value::Map(map), &mut bytes).unwrap();
    }
    STANDARD.encode(bytes)
}

pub(super) fn apple(
    device: &str,
    challenge: &str,
    key: &AppKey,
    field: &str,
    value: String,
) -> Value {
    json!({"device_id": device, "challenge": challenge, "app_attest": {"key_id": STANDARD.encode(&key.key_id), field: value}})
}

pub(super) async fn app_attest_attestation_and_assertions_verify(app: TestApp) {
    let (app, f) = app_for(app).await;
    let key = app_key();
    let challenge = app.challenge_for("iphone-1").await;
    let object = attestation_object(&key, &challenge, &f, Bad::None);
    let response = app
        .attest(&apple(
            "iphone-1",
            &challenge,
            &key,
            "attestation_object",
            object,
        ))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        (body["level"].as_str(), body["platform"].as_str()),
        (Some("strong"), Some("app_attest")),
        "{body}"
    );

    // Assertions with a growing counter renew the verdict; a replay fails.
    for counter in [1, 2, 5] {
        let response = app.assert_with("iphone-1", &key, counter, false).await;
        assert_eq!(response.status(), StatusCode::OK, "counter {counter}");
    }
    for (counter, tamper, reason) in [
        (5, false, "counter_replayed"),
        (9, true, "signature_invalid"),
    ] {
        let response = app.assert_with("iphone-1", &key, counter, tamper).await;
        let envelope = assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        assert_eq!(envelope["error"]["details"]["reason"], reason, "{envelope}");
    }
    // A key is attested once; a key nobody attested cannot assert; a key is its device's.
    let challenge = app.challenge_for("iphone-1").await;
    app.rejected(
        &apple(
            "iphone-1",
            &challenge,
            &key,
            "attestation_object",
            attestation_object(&key, &challenge, &f, Bad::None),
        ),
        "key_already_attested",
    )
    .await;
    // A second genuine key for the same id (another device, or a reinstall) is refused: the
    // id stays bound to its first key.
    let second = app_key();
    let challenge = app.challenge_for("iphone-1").await;
    app.rejected(
        &apple(
            "iphone-1",
            &challenge,
            &second,
            "attestation_object",
            attestation_object(&second, &challenge, &f, Bad::None),
        ),
        "device_bound",
    )
    .await;
    let stored: Value = app
        .get("/v1/attestations/iphone-1", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(stored["level"], "strong", "{stored}");
    for (device, signer) in [("iphone-1", &app_key()), ("iphone-2", &key)] {
        let response = app.assert_with(device, signer, 10, false).await;
        let envelope = assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        assert_eq!(
            envelope["error"]["details"]["reason"], "unknown_key",
            "{envelope}"
        );
    }
}

impl TestApp {
    /// An assertion by `key` for `device` over a fresh challenge, with `counter`.
    async fn assert_with(
        &self,
        device: &str,
        key: &AppKey,
        counter: u32,
        tamper: bool,
    ) -> reqwest::Response {
        let challenge = self.challenge_for(device).await;
        self.attest(&apple(
            device,
            &challenge,
            key,
            "assertion",
            assertion(key, &challenge, counter, tamper),
        ))
        .await
    }
}

pub(super) async fn each_app_attest_check_fails_on_its_own(app: TestApp) {
    let (app, f) = app_for(app).await;
    for (bad, reason) in [
        (Bad::OtherCa, "chain_invalid"),
        (Bad::OtherAppId, "app_id_mismatch"),
        (Bad::OtherChallenge, "nonce_mismatch"),
        (Bad::Counter, "counter_not_zero"),
        (Bad::Development, "aaguid_mismatch"),
    ] {
        let key = app_key();
        let challenge = app.challenge_for("iphone-3").await;
        let object = attestation_object(&key, &challenge, &f, bad);
        app.rejected(
            &apple("iphone-3", &challenge, &key, "attestation_object", object),
            reason,
        )
        .await;
    }
    // The key id must be the key's.
    let (key, other) = (app_key(), app_key());
    let challenge = app.challenge_for("iphone-3").await;
    let object = attestation_object(&key, &challenge, &f, Bad::None);
    app.rejected(
        &apple("iphone-3", &challenge, &other, "attestation_object", object),
        "key_id_mismatch",
    )
    .await;
    let challenge = app.challenge_for("iphone-3").await;
    app.rejected(
        &apple(
            "iphone-3",
            &challenge,
            &key,
            "attestation_object",
            STANDARD.encode(b"\x01\x02"),
        ),
        "malformed",
    )
    .await;
    let response = app
        .attest(&json!({"device_id": "iphone-3", "challenge": "c", "app_attest": {"key_id": "%%%", "assertion": "AAAA"}}))
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}
