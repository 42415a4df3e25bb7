//! Device attestation end to end, with a test root CA and test keys made here (rcgen, ring):
//! valid App Attest objects, assertions and Play Integrity tokens, then each check failing
//! on its own with its own reason. On both backends.
use std::sync::Arc;

use std::time::Duration;

use base64::Engine as _;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

use reqwest::StatusCode;

use ring::rand::SystemRandom;

use ring::signature::{self, EcdsaKeyPair, KeyPair as _};

use serde_json::{Value, json};

use sha2::{Digest, Sha256};

use crate::helpers::{ADMIN_TOKEN, TestApp, assert_envelope};

use crate::on_both_backends;

mod app_attest;
mod decoded; // verdicts the caller decoded: unsigned, off by default, capped

use app_attest::*;

on_both_backends!(
    play_integrity_tokens_are_decrypted_verified_and_levelled,
    each_play_integrity_check_fails_on_its_own,
    challenges_are_single_use_and_expire,
    a_negative_play_verdict_is_stored_as_failed,
    strong_and_unverified_devices_get_different_multipliers,
    attestation_routes_need_their_roles,
    an_attested_device_has_its_own_login_budget_behind_a_busy_address,
    an_attested_app_gets_a_code_from_a_pumped_destination_before_it_has_an_account,
);

const APP_ID: &str = "ABCDE12345.com.example.app";

const PACKAGE: &str = "com.example.app";

/// Keys and certificates of one test deployment.
struct Fixtures {
    /// App Attest root (trusted by the app under test).
    root: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    intermediate: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    /// Play Integrity keys.
    decryption: [u8; 32],
    signing: EcdsaKeyPair,
    verification_spki: Vec<u8>,
    cert_digest: [u8; 32],
}

fn ca(name: &str, alg: &'static rcgen::SignatureAlgorithm) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let _ = alg;
    params
}

impl Fixtures {
    fn new() -> Self {
        let root_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let root = rcgen::CertifiedIssuer::self_signed(
            ca(
                "Test App Attestation Root CA",
                &rcgen::PKCS_ECDSA_P384_SHA384,
            ),
            root_key,
        )
        .unwrap();
        let inter_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let intermediate = rcgen::CertifiedIssuer::signed_by(
            ca("Test App Attestation CA 1", &rcgen::PKCS_ECDSA_P384_SHA384),
            inter_key,
            &root,
        )
        .unwrap();
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap();
        let signing = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        let rcgen_key = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap();
        let mut decryption = [0u8; 32];
        ring::rand::SecureRandom::fill(&rng, &mut decryption).unwrap();
        Fixtures {
            root,
            intermediate,
            decryption,
            verification_spki: rcgen::PublicKeyData::subject_public_key_info(&rcgen_key),
            signing,
            cert_digest: Sha256::digest(b"the app's signing certificate").into(),
        }
    }

    fn root_pem(&self) -> String {
        self.root.pem()
    }
}

/// Settings for an app trusting these fixtures (root CA written into the app's data dir).
fn configure(settings: &mut palisade::Settings, fixtures: &Fixtures) {
    let path = settings.data_dir.join("apple-root.pem");
    std::fs::create_dir_all(&settings.data_dir).unwrap();
    std::fs::write(&path, fixtures.root_pem()).unwrap();
    let attestation = &mut settings.attestation;
    attestation.app_attest.app_ids = vec![APP_ID.to_owned()];
    attestation.app_attest.root_ca = Some(path);
    attestation.play_integrity.package_names = vec![PACKAGE.to_owned()];
    attestation.play_integrity.certificate_sha256 =
        vec![URL_SAFE_NO_PAD.encode(fixtures.cert_digest)];
    attestation.play_integrity.decryption_key = Some(palisade::config::Secret::new(
        STANDARD.encode(fixtures.decryption),
    ));
    attestation.play_integrity.verification_key =
        Some(STANDARD.encode(&fixtures.verification_spki));
}

async fn app_for(app: TestApp) -> (TestApp, Arc<Fixtures>) {
    app_for_with(app, |_| {}).await
}

/// [`app_for`] with `tweak` applied to the settings as well.
async fn app_for_with(
    app: TestApp,
    tweak: impl FnOnce(&mut palisade::Settings) + Send + 'static,
) -> (TestApp, Arc<Fixtures>) {
    let fixtures = Arc::new(Fixtures::new());
    let backend = app.backend;
    drop(app);
    let f = fixtures.clone();
    let app = TestApp::spawn_with(backend, move |s| {
        configure(s, &f);
        tweak(s);
    })
    .await
    .unwrap();
    (app, fixtures)
}

fn b64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A Play Integrity verdict payload.
fn verdict(challenge: &str, now_ms: i64, device: &[&str], fixtures: &Fixtures) -> Value {
    json!({
        "requestDetails": {"requestPackageName": PACKAGE, "timestampMillis": now_ms.to_string(), "nonce": challenge},
        "appIntegrity": {"appRecognitionVerdict": "PLAY_RECOGNIZED", "packageName": PACKAGE,
            "certificateSha256Digest": [b64url(&fixtures.cert_digest)], "versionCode": "42"},
        "deviceIntegrity": {"deviceRecognitionVerdict": device},
        "accountDetails": {"appLicensingVerdict": "LICENSED"},
    })
}

/// A change to a verdict payload (and the challenge it was made for).
type Mutation = Box<dyn Fn(&mut Value, &str)>;

/// How to spoil a token.
#[derive(Clone, Copy, PartialEq)]
enum Spoil {
    None,
    Signature,
    Ciphertext,
    JweAlgorithm,
    JwsAlgorithm,
}

/// An integrity token (JWE A256KW + A256GCM around a JWS ES256) for `payload`, spoiled
/// as asked.
fn token(payload: &Value, fixtures: &Fixtures, spoil: Spoil) -> String {
    use palisade::attestation::testing::{seal_jwe, sign_jws};
    let jws_alg = if spoil == Spoil::JwsAlgorithm {
        "HS256"
    } else {
        "ES256"
    };
    let mut jws = sign_jws(&json!({"alg": jws_alg}), payload, &fixtures.signing);
    if spoil == Spoil::Signature {
        // Flip one bit of the signature's first byte (its base64 starts after the last dot).
        let at = jws.rfind('.').unwrap() + 1;
        let first = if &jws[at..at + 1] == "A" { "B" } else { "A" };
        jws.replace_range(at..at + 1, first);
    }
    let jwe_alg = if spoil == Spoil::JweAlgorithm {
        "RSA-OAEP-256"
    } else {
        "A256KW"
    };
    let mut token = seal_jwe(
        &json!({"alg": jwe_alg, "enc": "A256GCM"}),
        &jws,
        &fixtures.decryption,
    );
    if spoil == Spoil::Ciphertext {
        let parts: Vec<&str> = token.split('.').collect();
        let mut ciphertext = URL_SAFE_NO_PAD.decode(parts[3]).unwrap();
        ciphertext[5] ^= 1;
        token = format!(
            "{}.{}.{}.{}.{}",
            parts[0],
            parts[1],
            parts[2],
            b64url(&ciphertext),
            parts[4]
        );
    }
    token
}

impl TestApp {
    async fn challenge_for(&self, device: &str) -> String {
        let response = self
            .post(
                "/v1/attestations/challenge",
                Some(ADMIN_TOKEN),
                &json!({"device_id": device}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.unwrap();
        assert!(body["expires_at"].is_string());
        body["challenge"].as_str().unwrap().to_owned()
    }

    async fn attest(&self, body: &Value) -> reqwest::Response {
        self.post("/v1/attestations", Some(ADMIN_TOKEN), body).await
    }

    /// A well-formed App Attest attestation of `device` for a fresh challenge, submitted.
    async fn attest_app(&self, device: &str, fixtures: &Fixtures) -> reqwest::Response {
        let key = app_key();
        let challenge = self.challenge_for(device).await;
        let object = attestation_object(&key, &challenge, fixtures, Bad::None);
        self.attest(&apple(
            device,
            &challenge,
            &key,
            "attestation_object",
            object,
        ))
        .await
    }

    /// Submits and expects a rejection with `reason`.
    async fn rejected(&self, body: &Value, reason: &str) {
        let response = self.attest(body).await;
        let envelope = assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
        assert_eq!(envelope["error"]["details"]["reason"], reason, "{envelope}");
    }

    fn now(&self) -> i64 {
        self.app.clock.now_ms()
    }
}

fn play(device: &str, challenge: &str, token: String) -> Value {
    json!({"device_id": device, "challenge": challenge, "play_integrity": {"token": token}})
}

async fn play_integrity_tokens_are_decrypted_verified_and_levelled(app: TestApp) {
    let (app, f) = app_for(app).await;
    for (device, verdicts, level) in [
        (
            "android-strong",
            vec![
                "MEETS_STRONG_INTEGRITY",
                "MEETS_DEVICE_INTEGRITY",
                "MEETS_BASIC_INTEGRITY",
            ],
            "strong",
        ),
        (
            "android-device",
            vec!["MEETS_DEVICE_INTEGRITY", "MEETS_BASIC_INTEGRITY"],
            "device",
        ),
        ("android-basic", vec!["MEETS_BASIC_INTEGRITY"], "basic"),
        (
            "android-virtual",
            vec!["MEETS_VIRTUAL_INTEGRITY"],
            "virtual",
        ),
    ] {
        let challenge = app.challenge_for(device).await;
        let t = token(
            &verdict(&challenge, app.now(), &verdicts, &f),
            &f,
            Spoil::None,
        );
        let response = app.attest(&play(device, &challenge, t)).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["level"], level, "{device}: {body}");
        assert_eq!(body["platform"], "play_integrity");
        assert!(
            body["reasons"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["code"] == "play_integrity_token")
        );
    }
    // A Google-vouched emulator has its own factor: 0.5 on auth, between an unattested
    // device's 0.25 and basic integrity's 0.75.
    let view = app
        .admin_json("/v1/multipliers?device_id=android-virtual&endpoint=/auth/login&method=POST")
        .await;
    assert_eq!(
        view["keys"]["device:android-virtual"]["multiplier"], 0.5,
        "{view}"
    );
    let stored: Value = app
        .get("/v1/attestations/android-strong", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(stored["level"], "strong");
    let none = app
        .get("/v1/attestations/never-seen", Some(ADMIN_TOKEN))
        .await;
    assert_envelope(none, StatusCode::NOT_FOUND, "NOT_FOUND").await;
}

async fn each_play_integrity_check_fails_on_its_own(app: TestApp) {
    let (app, f) = app_for(app).await;
    let device = "android-1";
    let strong = ["MEETS_STRONG_INTEGRITY"];
    // Tampered signature, tampered ciphertext, unsupported algorithms.
    for (spoil, reason) in [
        (Spoil::Signature, "signature_invalid"),
        (Spoil::Ciphertext, "decryption_failed"),
        (Spoil::JweAlgorithm, "unsupported_algorithm"),
        (Spoil::JwsAlgorithm, "unsupported_algorithm"),
    ] {
        let challenge = app.challenge_for(device).await;
        let t = token(&verdict(&challenge, app.now(), &strong, &f), &f, spoil);
        app.rejected(&play(device, &challenge, t), reason).await;
    }
    // Wrong package, wrong signing certificate, stale timestamp, wrong nonce.
    let mutations: Vec<(&str, Mutation)> = vec![
        (
            "package_mismatch",
            Box::new(|v, _| v["requestDetails"]["requestPackageName"] = json!("com.evil.clone")),
        ),
        (
            "certificate_digest_mismatch",
            Box::new(|v, _| {
                v["appIntegrity"]["certificateSha256Digest"] = json!([b64url(&[7u8; 32])])
            }),
        ),
        (
            "nonce_mismatch",
            Box::new(|v, _| v["requestDetails"]["nonce"] = json!("another-challenge")),
        ),
        (
            "stale_timestamp",
            Box::new(|v, _| {
                let old = v["requestDetails"]["timestampMillis"]
                    .as_str()
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
                    - 600_000;
                v["requestDetails"]["timestampMillis"] = json!(old.to_string());
            }),
        ),
    ];
    for (reason, mutate) in mutations {
        let challenge = app.challenge_for(device).await;
        let mut v = verdict(&challenge, app.now(), &strong, &f);
        mutate(&mut v, &challenge);
        app.rejected(
            &play(device, &challenge, token(&v, &f, Spoil::None)),
            reason,
        )
        .await;
    }
    // Another app's keys (a token encrypted for someone else) do not decrypt.
    let stranger = Fixtures::new();
    let challenge = app.challenge_for(device).await;
    let t = token(
        &verdict(&challenge, app.now(), &strong, &stranger),
        &stranger,
        Spoil::None,
    );
    app.rejected(&play(device, &challenge, t), "decryption_failed")
        .await;
    // Garbage is malformed, never a 500.
    let challenge = app.challenge_for(device).await;
    app.rejected(
        &play(device, &challenge, "not.a.token".to_owned()),
        "malformed",
    )
    .await;
    // None of them stored a verdict.
    let none = app
        .get(&format!("/v1/attestations/{device}"), Some(ADMIN_TOKEN))
        .await;
    assert_envelope(none, StatusCode::NOT_FOUND, "NOT_FOUND").await;
}

async fn challenges_are_single_use_and_expire(app: TestApp) {
    let (app, f) = app_for(app).await;
    let device = "android-2";
    let challenge = app.challenge_for(device).await;
    let body = play(
        device,
        &challenge,
        token(
            &verdict(&challenge, app.now(), &["MEETS_DEVICE_INTEGRITY"], &f),
            &f,
            Spoil::None,
        ),
    );
    assert_eq!(app.attest(&body).await.status(), StatusCode::OK);
    app.rejected(&body, "challenge_replayed").await;
    // A challenge issued for another device is unknown for this one.
    let theirs = app.challenge_for("android-other").await;
    let t = token(
        &verdict(&theirs, app.now(), &["MEETS_DEVICE_INTEGRITY"], &f),
        &f,
        Spoil::None,
    );
    app.rejected(&play(device, &theirs, t), "challenge_unknown")
        .await;
    app.rejected(
        &play(device, "never-issued", "x.y.z.a.b".to_owned()),
        "challenge_unknown",
    )
    .await;
    // Past its TTL it is expired (embedded: the manual clock; production: a 1 s TTL).
    let app = if app.backend == crate::helpers::Backend::Production {
        let backend = app.backend;
        let f2 = f.clone();
        drop(app);
        TestApp::spawn_with(backend, move |s| {
            configure(s, &f2);
            s.attestation.challenge_ttl_s = 1;
        })
        .await
        .unwrap()
    } else {
        app
    };
    let challenge = app.challenge_for(device).await;
    let ttl = app.settings.attestation.challenge_ttl_s;
    app.advance(Duration::from_millis(ttl * 1000 + 100)).await;
    let t = token(
        &verdict(&challenge, app.now(), &["MEETS_DEVICE_INTEGRITY"], &f),
        &f,
        Spoil::None,
    );
    app.rejected(&play(device, &challenge, t), "challenge_expired")
        .await;
}

async fn a_negative_play_verdict_is_stored_as_failed(app: TestApp) {
    let (app, f) = app_for(app).await;
    let challenge = app.challenge_for("android-rooted").await;
    let mut v = verdict(&challenge, app.now(), &[], &f);
    v["appIntegrity"]["appRecognitionVerdict"] = json!("UNRECOGNIZED_VERSION");
    let body: Value = app
        .attest(&play(
            "android-rooted",
            &challenge,
            token(&v, &f, Spoil::None),
        ))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["level"], "failed", "{body}");
    let codes: Vec<&str> = body["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert!(
        codes.contains(&"device_integrity_not_met") && codes.contains(&"app_not_recognized"),
        "{codes:?}"
    );
    let view: Value = app
        .get(
            "/v1/multipliers?device_id=android-rooted&endpoint=/auth/login&method=POST",
            Some(ADMIN_TOKEN),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        view["keys"]["device:android-rooted"]["multiplier"], 0.25,
        "{view}"
    );
}

/// An App Attest key of a test device: its key pair, certificate and key id.
struct AppKey {
    pair: EcdsaKeyPair,
    rcgen: rcgen::KeyPair,
    key_id: Vec<u8>,
}

/// A strongly attested device and an unverified one get different multipliers, with reasons.
async fn strong_and_unverified_devices_get_different_multipliers(app: TestApp) {
    let (app, f) = app_for(app).await;
    let key = app_key();
    let challenge = app.challenge_for("iphone-strong").await;
    let object = attestation_object(&key, &challenge, &f, Bad::None);
    assert_eq!(
        app.attest(&apple(
            "iphone-strong",
            &challenge,
            &key,
            "attestation_object",
            object
        ))
        .await
        .status(),
        StatusCode::OK
    );
    for (endpoint, strong, unverified) in [
        ("/v1/feed&method=GET", 1.5, 1.0),
        ("/auth/login&method=POST", 1.5, 0.25),
    ] {
        let view: Value = app
            .get(
                &format!("/v1/multipliers?device_id=iphone-strong&endpoint={endpoint}"),
                Some(ADMIN_TOKEN),
            )
            .await
            .json()
            .await
            .unwrap();
        let key_view = &view["keys"]["device:iphone-strong"];
        assert_eq!(key_view["multiplier"], strong, "{view}");
        assert_eq!(key_view["reasons"][0]["code"], "attestation_strong");
        let view: Value = app
            .get(
                &format!("/v1/multipliers?device_id=iphone-new&endpoint={endpoint}"),
                Some(ADMIN_TOKEN),
            )
            .await
            .json()
            .await
            .unwrap();
        let key_view = &view["keys"]["device:iphone-new"];
        assert_eq!(key_view["multiplier"], unverified, "{view}");
        assert_eq!(key_view["reasons"][0]["code"], "attestation_unverified");
    }
    // Enforced: the device budget (600/min) is 1.5x for the strong device everywhere and
    // 0.25x for the unverified one on auth.
    let device_limit = |device: &str, endpoint: &str, method: &str| {
        let request = palisade::limiter::LimitRequest {
            method: method.to_owned(),
            endpoint: endpoint.to_owned(),
            ip: palisade::model::ClientIp::parse("192.0.2.1", 64).unwrap(),
            user: None,
            device: Some(palisade::model::SubjectKey::device(device, 64).unwrap()),
            tenant: None,
            recipient: None,
            cost: 1,
            consume: false,
        };
        let limiter = app.app.limiter.clone();
        async move {
            let decision = limiter.check(&request).await.unwrap();
            decision
                .scopes
                .iter()
                .find(|s| s.budget.as_ref() == "device")
                .unwrap()
                .limit
        }
    };
    assert_eq!(device_limit("iphone-strong", "/v1/feed", "GET").await, 900);
    assert_eq!(
        device_limit("iphone-strong", "/auth/login", "POST").await,
        900
    );
    assert_eq!(device_limit("iphone-new", "/v1/feed", "GET").await, 600);
    assert_eq!(device_limit("iphone-new", "/auth/login", "POST").await, 150);
}

/// An attested device does not share its address's login budget: when the other devices
/// behind one address have spent it, the attested one still logs in (counted per address and
/// device, under the IP-wide ceiling); an unattested newcomer does not.
async fn an_attested_device_has_its_own_login_budget_behind_a_busy_address(app: TestApp) {
    let (app, f) = app_for(app).await;
    let response = app.attest_app("iphone-own", &f).await;
    assert_eq!(response.status(), StatusCode::OK);
    let login = |user: &str, device: &str| {
        json!({"endpoint": "/auth/login", "method": "POST", "ip": "198.51.100.200",
            "user_id": user, "device_id": device})
    };
    // Ten people on ten unattested phones spend the address's 10 logins a minute.
    for i in 0..10 {
        let response = app
            .limit_check(&login(&format!("u{i}"), &format!("phone-{i}")))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "login {i}");
    }
    let newcomer = app.limit_check(&login("u-new", "phone-new")).await;
    assert_eq!(newcomer.status(), StatusCode::TOO_MANY_REQUESTS);
    let owner = app.limit_check(&login("owner", "iphone-own")).await;
    assert_eq!(
        owner.status(),
        StatusCode::OK,
        "the attested device has its own budget"
    );
    let body: Value = owner.json().await.unwrap();
    assert_eq!(
        body["remaining"], 4,
        "its account's 5 a minute decide now: {body}"
    );
    // Its own per-address budget: the budget's 10 × the device's multiplier (1.5 for a
    // strong verdict) = 15, one of them spent above.
    for i in 0..14 {
        let response = app
            .limit_check(&login(&format!("owner-{i}"), "iphone-own"))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "attested login {i}");
    }
    let spent = app.limit_check(&login("owner-10", "iphone-own")).await;
    assert_eq!(spent.status(), StatusCode::TOO_MANY_REQUESTS);
}

async fn attestation_routes_need_their_roles(app: TestApp) {
    let (_, limiter) = app.create_token("limiter", "gateway").await;
    let (_, ingest) = app.create_token("ingest", "auth-svc").await;
    let response = app
        .post(
            "/v1/attestations/challenge",
            Some(&limiter),
            &json!({"device_id": "d"}),
        )
        .await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    let response = app
        .post(
            "/v1/attestations/challenge",
            Some(&ingest),
            &json!({"device_id": "d"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let response = app.get("/v1/attestations/d", Some(&ingest)).await;
    assert_envelope(response, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    // Not configured: a clear 400, not a 500.
    let challenge = app.challenge_for("d").await;
    app.rejected(&json!({"device_id": "d", "challenge": challenge, "play_integrity": {"token": "a.b.c.d.e"}}), "not_configured").await;
    let response = app
        .attest(&json!({"device_id": "d", "challenge": "x"}))
        .await;
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

/// A destination tightened for SMS pumping leaves a path to an honest person signing up: a
/// code asked from an attested app passes without an account; an unattested one does not.
async fn an_attested_app_gets_a_code_from_a_pumped_destination_before_it_has_an_account(
    app: TestApp,
) {
    use crate::messaging::{otp, pump_the_uk_770_range, reason, refused_by_destination};
    // One-minute conversion windows: an event two minutes ahead closes the window of now.
    let (app, f) = app_for_with(app, |s| s.messaging.conversion.window_s = 60).await;
    let response = app.attest_app("iphone-signup", &f).await;
    assert_eq!(response.status(), StatusCode::OK);
    pump_the_uk_770_range(&app).await;
    let mut signup = otp("192.0.2.80", "+44 7700 900777");
    signup["device_id"] = json!("iphone-signup");
    let (status, body) = reason(app.limit_check(&signup).await).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    signup["device_id"] = json!("phone-unattested");
    refused_by_destination(&app, &signup).await;
}
