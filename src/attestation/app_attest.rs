//! Apple App Attest: attestation objects and assertions, verified locally.
//!
//! Follows Apple's "Validating apps that connect to your server"
//! (<https://developer.apple.com/documentation/devicecheck/validating-apps-that-connect-to-your-server>)
//! step by step. CBOR is `ciborium`, certificates and their signatures `x509-parser` (ring),
//! the assertion signature `ring`. Pure: the time, the client data hash and the trusted root
//! are parameters (Apple's own sample object uses raw bytes as its client data hash).

use ciborium::Value;
use ring::signature::{self, UnparsedPublicKey};
use sha2::{Digest, Sha256};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;
use x509_parser::time::ASN1Time;

use super::Rejection;
use crate::config::AppAttestEnvironment;

/// The credential certificate extension holding the nonce.
const NONCE_OID: &str = "1.2.840.113635.100.8.2";
const AAGUID_PRODUCTION: &[u8; 16] = b"appattest\0\0\0\0\0\0\0";
const AAGUID_DEVELOPMENT: &[u8; 16] = b"appattestdevelop";

/// What an accepted attestation established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attested {
    /// SHA-256 of the credential public key (the app's key id).
    pub key_id: Vec<u8>,
    /// The credential public key, an uncompressed P-256 point: stored to verify assertions.
    pub public_key: Vec<u8>,
    /// SHA-256(authData ‖ clientDataHash), equal to the certificate's nonce.
    pub nonce: Vec<u8>,
    /// The authenticator data's RP ID hash.
    pub rp_id_hash: Vec<u8>,
    /// The app id it matched.
    pub app_id: String,
    /// The sign counter (0 in an attestation).
    pub counter: u32,
    /// `appattest` + zeros, or `appattestdevelop`.
    pub aaguid: Vec<u8>,
    /// Apple's receipt (for fraud-risk queries to Apple; not checked here).
    pub receipt: Vec<u8>,
}

/// The parts of WebAuthn authenticator data App Attest uses.
struct AuthData<'a> {
    rp_id_hash: &'a [u8],
    counter: u32,
    /// `(aaguid, credential id)`, present in attestations.
    credential: Option<(&'a [u8], &'a [u8])>,
}

fn auth_data(bytes: &[u8], attested: bool) -> Result<AuthData<'_>, Rejection> {
    let short = || Rejection::Malformed("authenticator data is too short".to_owned());
    if bytes.len() < 37 {
        return Err(short());
    }
    let counter = u32::from_be_bytes([bytes[33], bytes[34], bytes[35], bytes[36]]);
    let credential = if attested {
        let rest = &bytes[37..];
        if rest.len() < 18 {
            return Err(short());
        }
        let len = usize::from(u16::from_be_bytes([rest[16], rest[17]]));
        let id = rest.get(18..18 + len).ok_or_else(short)?;
        Some((&rest[..16], id))
    } else {
        None
    };
    Ok(AuthData {
        rp_id_hash: &bytes[..32],
        counter,
        credential,
    })
}

fn map_get<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.as_text() == Some(key))
        .map(|(_, v)| v)
}

fn bytes_of<'a>(value: Option<&'a Value>, what: &str) -> Result<&'a [u8], Rejection> {
    value
        .and_then(Value::as_bytes)
        .map(Vec::as_slice)
        .ok_or_else(|| Rejection::Malformed(format!("{what} is missing or not a byte string")))
}

fn cbor_map(bytes: &[u8], what: &str) -> Result<Vec<(Value, Value)>, Rejection> {
    let value: Value = ciborium::from_reader(bytes)
        .map_err(|_| Rejection::Malformed(format!("the {what} is not CBOR")))?;
    value
        .into_map()
        .map_err(|_| Rejection::Malformed(format!("the {what} is not a CBOR map")))
}

fn certificate<'a>(der: &'a [u8], what: &str) -> Result<X509Certificate<'a>, Rejection> {
    X509Certificate::from_der(der)
        .map(|(_, cert)| cert)
        .map_err(|_| Rejection::Malformed(format!("the {what} is not an X.509 certificate")))
}

/// The nonce in the credential certificate: DER `SEQUENCE { [1] EXPLICIT OCTET STRING }`.
fn certificate_nonce(cert: &X509Certificate<'_>) -> Result<Vec<u8>, Rejection> {
    use x509_parser::der_parser::asn1_rs::{Any, Sequence};
    let missing =
        || Rejection::NonceMismatch("the credential certificate has no nonce extension".to_owned());
    let extension = cert
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == NONCE_OID)
        .ok_or_else(missing)?;
    let (_, sequence) = Sequence::from_der(extension.value).map_err(|_| missing())?;
    let (_, tagged) = Any::from_der(&sequence.content).map_err(|_| missing())?;
    let (_, octets) = Any::from_der(tagged.data).map_err(|_| missing())?;
    if tagged.tag().0 != 1 || octets.tag().0 != 4 {
        return Err(missing());
    }
    Ok(octets.data.to_vec())
}

/// Clock skew allowed on a certificate's `notBefore`, seconds: Apple issues the credential
/// certificate at the moment of attestation, and our clock may be behind Apple's.
pub const NOT_BEFORE_SKEW_S: i64 = 120;

fn check_validity(cert: &X509Certificate<'_>, now: ASN1Time, what: &str) -> Result<(), Rejection> {
    let validity = cert.validity();
    let at = now.timestamp();
    if validity.not_before.timestamp() - NOT_BEFORE_SKEW_S <= at
        && at <= validity.not_after.timestamp()
    {
        Ok(())
    } else {
        Err(Rejection::CertificateExpired(format!(
            "the {what} is valid from {} to {}, not at {}",
            cert.validity().not_before,
            cert.validity().not_after,
            now
        )))
    }
}

/// Verifies an attestation object for `key_id`, whose app appended `client_data_hash` to
/// its authenticator data, against the trusted `root_der` at `now_unix_s`.
pub fn verify_attestation(
    object: &[u8],
    key_id: &[u8],
    client_data_hash: &[u8],
    app_ids: &[String],
    environment: AppAttestEnvironment,
    root_der: &[u8],
    now_unix_s: i64,
) -> Result<Attested, Rejection> {
    let map = cbor_map(object, "attestation object")?;
    let format = map_get(&map, "fmt").and_then(Value::as_text);
    if format != Some("apple-appattest") {
        return Err(Rejection::UnsupportedFormat(format!(
            "attestation format {format:?}; only apple-appattest is accepted"
        )));
    }
    let statement = map_get(&map, "attStmt")
        .and_then(Value::as_map)
        .ok_or_else(|| Rejection::Malformed("attStmt is missing".to_owned()))?;
    let chain = map_get(statement, "x5c")
        .and_then(Value::as_array)
        .ok_or_else(|| Rejection::Malformed("attStmt.x5c is missing".to_owned()))?;
    let chain: Vec<&[u8]> = chain
        .iter()
        .map(|c| c.as_bytes().map(Vec::as_slice))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            Rejection::Malformed("x5c holds something other than certificates".to_owned())
        })?;
    let [leaf_der, intermediate_der, ..] = chain[..] else {
        return Err(Rejection::ChainInvalid(
            "x5c must hold the credential and the intermediate certificate".to_owned(),
        ));
    };
    let receipt = map_get(statement, "receipt")
        .and_then(Value::as_bytes)
        .cloned()
        .unwrap_or_default();
    let auth_bytes = bytes_of(map_get(&map, "authData"), "authData")?;

    // 1. The chain: credential ← intermediate ← Apple's root, each valid now.
    let leaf = certificate(leaf_der, "credential certificate")?;
    let intermediate = certificate(intermediate_der, "intermediate certificate")?;
    let root = certificate(root_der, "root certificate")?;
    leaf.verify_signature(Some(intermediate.public_key()))
        .map_err(|e| {
            Rejection::ChainInvalid(format!(
                "the credential certificate is not signed by the intermediate: {e}"
            ))
        })?;
    intermediate
        .verify_signature(Some(root.public_key()))
        .map_err(|e| {
            Rejection::ChainInvalid(format!(
                "the intermediate is not signed by the App Attestation root: {e}"
            ))
        })?;
    if !intermediate.is_ca() {
        return Err(Rejection::ChainInvalid(
            "the intermediate is not a CA".to_owned(),
        ));
    }
    let now = ASN1Time::from_timestamp(now_unix_s)
        .map_err(|_| Rejection::Malformed("the time is out of range".to_owned()))?;
    check_validity(&leaf, now, "credential certificate")?;
    check_validity(&intermediate, now, "intermediate certificate")?;
    check_validity(&root, now, "root certificate")?;

    // 2-4. nonce = SHA-256(authData ‖ clientDataHash) is in the credential certificate.
    let nonce = Sha256::new()
        .chain_update(auth_bytes)
        .chain_update(client_data_hash)
        .finalize()
        .to_vec();
    if certificate_nonce(&leaf)? != nonce {
        return Err(Rejection::NonceMismatch(
            "the certificate's nonce is not SHA-256(authData ‖ clientDataHash): wrong challenge"
                .to_owned(),
        ));
    }
    // 5. The key id is the SHA-256 of the credential public key.
    let public_key = leaf.public_key().subject_public_key.data.to_vec();
    let computed_key_id = Sha256::digest(&public_key).to_vec();
    if computed_key_id != key_id {
        return Err(Rejection::KeyIdMismatch(
            "the key id is not the SHA-256 of the credential public key".to_owned(),
        ));
    }
    let auth = auth_data(auth_bytes, true)?;
    // 6. The RP ID hash is the SHA-256 of one of our app ids.
    let app_id = app_ids
        .iter()
        .find(|id| Sha256::digest(id.as_bytes())[..] == *auth.rp_id_hash)
        .ok_or_else(|| {
            Rejection::AppIdMismatch(
                "the RP ID hash matches none of the configured app ids".to_owned(),
            )
        })?;
    // 7. A fresh key has signed nothing yet.
    if auth.counter != 0 {
        return Err(Rejection::CounterNotZero(format!(
            "the attestation's counter is {}, not 0",
            auth.counter
        )));
    }
    let (aaguid, credential_id) = auth.credential.ok_or_else(|| {
        Rejection::Malformed("authData has no attested credential data".to_owned())
    })?;
    // 8. The environment.
    let expected_aaguid: &[u8] = match environment {
        AppAttestEnvironment::Production => AAGUID_PRODUCTION,
        AppAttestEnvironment::Development => AAGUID_DEVELOPMENT,
    };
    if aaguid != expected_aaguid {
        return Err(Rejection::AaguidMismatch(format!(
            "aaguid {:?} is not the {environment:?} environment's",
            String::from_utf8_lossy(aaguid).trim_end_matches('\0')
        )));
    }
    // 9. The credential id is the key id.
    if credential_id != key_id {
        return Err(Rejection::CredentialIdMismatch(
            "the credential id is not the key id".to_owned(),
        ));
    }
    Ok(Attested {
        key_id: key_id.to_vec(),
        public_key,
        nonce,
        rp_id_hash: auth.rp_id_hash.to_vec(),
        app_id: app_id.clone(),
        counter: auth.counter,
        aaguid: aaguid.to_vec(),
        receipt,
    })
}

/// Verifies an assertion by the attested key `public_key` over `client_data_hash`; returns
/// its counter, which must exceed `last_counter` (a replayed assertion fails).
pub fn verify_assertion(
    assertion: &[u8],
    client_data_hash: &[u8],
    public_key: &[u8],
    app_ids: &[String],
    last_counter: u32,
) -> Result<u32, Rejection> {
    let map = cbor_map(assertion, "assertion")?;
    let signature = bytes_of(map_get(&map, "signature"), "signature")?;
    let auth_bytes = bytes_of(map_get(&map, "authenticatorData"), "authenticatorData")?;
    let nonce = Sha256::new()
        .chain_update(auth_bytes)
        .chain_update(client_data_hash)
        .finalize();
    UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, public_key)
        .verify(&nonce, signature)
        .map_err(|_| {
            Rejection::SignatureInvalid(
                "the assertion's signature does not verify with the attested key".to_owned(),
            )
        })?;
    let auth = auth_data(auth_bytes, false)?;
    if !app_ids
        .iter()
        .any(|id| Sha256::digest(id.as_bytes())[..] == *auth.rp_id_hash)
    {
        return Err(Rejection::AppIdMismatch(
            "the RP ID hash matches none of the configured app ids".to_owned(),
        ));
    }
    if auth.counter <= last_counter {
        return Err(Rejection::CounterReplayed(format!(
            "counter {} does not exceed the last one seen, {last_counter}: a replayed assertion",
            auth.counter
        )));
    }
    Ok(auth.counter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    /// Apple's sample object (`tests/fixtures/attestation`), its fields decoded; the root is
    /// the one built into the service.
    struct Sample {
        object: Vec<u8>,
        key_id: Vec<u8>,
        client_data_hash: Vec<u8>,
        app_id: String,
        nonce: Vec<u8>,
        rp_id_hash: Vec<u8>,
        valid_at: i64,
        root: Vec<u8>,
    }

    fn sample() -> Sample {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/attestation/apple-sample-attestation.json");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file).expect("the fixture")).unwrap();
        let b64 = |field: &str| STANDARD.decode(json[field].as_str().unwrap()).unwrap();
        let (_, root) = x509_parser::pem::parse_x509_pem(super::super::APPLE_ROOT_PEM).unwrap();
        Sample {
            object: b64("attestation_object_b64"),
            key_id: b64("key_id_b64"),
            client_data_hash: json["client_data_hash_utf8"]
                .as_str()
                .unwrap()
                .as_bytes()
                .to_vec(),
            app_id: json["app_id"].as_str().unwrap().to_owned(),
            nonce: b64("expected_nonce_b64"),
            rp_id_hash: b64("expected_rp_id_hash_b64"),
            valid_at: chrono::DateTime::parse_from_rfc3339(json["valid_at"].as_str().unwrap())
                .unwrap()
                .timestamp(),
            root: root.contents,
        }
    }

    fn verify(
        s: &Sample,
        app_id: &str,
        env: AppAttestEnvironment,
        at: i64,
    ) -> Result<Attested, Rejection> {
        verify_attestation(
            &s.object,
            &s.key_id,
            &s.client_data_hash,
            &[app_id.to_owned()],
            env,
            &s.root,
            at,
        )
    }

    #[test]
    fn apples_sample_verifies_at_its_time_against_apples_root_with_every_value_checked() {
        let s = sample();
        let attested = verify(&s, &s.app_id, AppAttestEnvironment::Production, s.valid_at)
            .expect("Apple's sample verifies");
        assert_eq!(attested.nonce, s.nonce);
        assert_eq!(attested.rp_id_hash, s.rp_id_hash);
        assert_eq!(attested.key_id, s.key_id);
        assert_eq!(Sha256::digest(&attested.public_key).to_vec(), s.key_id);
        assert_eq!(attested.counter, 0);
        assert_eq!(attested.aaguid, AAGUID_PRODUCTION.to_vec());
        assert_eq!(attested.app_id, s.app_id);
        assert!(!attested.receipt.is_empty());
    }

    #[test]
    fn apples_sample_is_expired_today() {
        let s = sample();
        let today = 1_796_169_600; // 2026-12-02
        let err = verify(&s, &s.app_id, AppAttestEnvironment::Production, today).unwrap_err();
        assert_eq!(err.code(), "certificate_expired", "{err}");
    }

    #[test]
    fn each_check_on_apples_sample_fails_on_its_own() {
        let s = sample();
        let at = s.valid_at;
        let other_app = verify(
            &s,
            "0352187391.com.example.other",
            AppAttestEnvironment::Production,
            at,
        );
        assert_eq!(other_app.unwrap_err().code(), "app_id_mismatch");
        let development = verify(&s, &s.app_id, AppAttestEnvironment::Development, at);
        assert_eq!(development.unwrap_err().code(), "aaguid_mismatch");
        let wrong_challenge = verify_attestation(
            &s.object,
            &s.key_id,
            b"another challenge",
            std::slice::from_ref(&s.app_id),
            AppAttestEnvironment::Production,
            &s.root,
            at,
        );
        assert_eq!(wrong_challenge.unwrap_err().code(), "nonce_mismatch");
        let mut key_id = s.key_id.clone();
        key_id[0] ^= 1;
        let wrong_key = verify_attestation(
            &s.object,
            &key_id,
            &s.client_data_hash,
            std::slice::from_ref(&s.app_id),
            AppAttestEnvironment::Production,
            &s.root,
            at,
        );
        assert_eq!(wrong_key.unwrap_err().code(), "key_id_mismatch");
        // Another root (the intermediate itself is not the trusted root).
        let leaf_only = verify_attestation(
            &s.object,
            &s.key_id,
            &s.client_data_hash,
            std::slice::from_ref(&s.app_id),
            AppAttestEnvironment::Production,
            &[0x30, 0x03, 0x02, 0x01, 0x00],
            at,
        );
        assert_eq!(leaf_only.unwrap_err().code(), "malformed");
        let garbage = verify_attestation(
            b"\xff\x00",
            &s.key_id,
            &s.client_data_hash,
            std::slice::from_ref(&s.app_id),
            AppAttestEnvironment::Production,
            &s.root,
            at,
        );
        assert_eq!(garbage.unwrap_err().code(), "malformed");
    }
}
