//! Play verdicts the caller decoded itself: unsigned, so off by default, refused while token
//! keys are configured, and when allowed marked, capped below strong and never a replacement
//! for a verified verdict.

use super::*;

on_both_backends!(unsigned_decoded_verdicts_are_off_capped_and_never_replace_a_verified_one);

fn decoded(device: &str, challenge: &str, payload: Value) -> Value {
    json!({"device_id": device, "challenge": challenge, "play_integrity": {"verdict": payload}})
}

/// A caller-decoded Play verdict is unsigned: anyone with an ingest token can write one by
/// hand. It is off by default, refused while the keys to verify tokens are configured, and
/// when turned on it is marked, never reaches strong, and never replaces a verified verdict.
async fn unsigned_decoded_verdicts_are_off_capped_and_never_replace_a_verified_one(app: TestApp) {
    let backend = app.backend;
    let (app, f) = app_for(app).await;
    let strong = ["MEETS_STRONG_INTEGRITY", "MEETS_DEVICE_INTEGRITY"];
    // Default settings, keys configured: refused.
    let challenge = app.challenge_for("hand-written").await;
    app.rejected(
        &decoded(
            "hand-written",
            &challenge,
            verdict(&challenge, app.now(), &strong, &f),
        ),
        "unsupported_format",
    )
    .await;
    drop(app);
    // Turned on while the keys are configured: still refused.
    let f2 = f.clone();
    let app = TestApp::spawn_with(backend, move |s| {
        configure(s, &f2);
        s.attestation.play_integrity.accept_decoded = true;
    })
    .await
    .unwrap();
    let challenge = app.challenge_for("hand-written").await;
    app.rejected(
        &decoded(
            "hand-written",
            &challenge,
            verdict(&challenge, app.now(), &strong, &f),
        ),
        "unsupported_format",
    )
    .await;
    drop(app);
    // Turned on without the keys: accepted, capped at device, marked.
    let f3 = f.clone();
    let app = TestApp::spawn_with(backend, move |s| {
        configure(s, &f3);
        s.attestation.play_integrity.accept_decoded = true;
        s.attestation.play_integrity.decryption_key = None;
        s.attestation.play_integrity.verification_key = None;
    })
    .await
    .unwrap();
    let challenge = app.challenge_for("hand-written").await;
    let body: Value = app
        .attest(&decoded(
            "hand-written",
            &challenge,
            verdict(&challenge, app.now(), &strong, &f),
        ))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["level"], "device", "{body}");
    let codes: Vec<&str> = body["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["code"].as_str())
        .collect();
    assert!(
        codes.contains(&"decoded_by_caller") && codes.contains(&"capped_unsigned"),
        "{body}"
    );
    // An iPhone attested with App Attest (verified, strong) is not downgraded by a decoded
    // Play verdict sent for its id: the id belongs to App Attest.
    let key = app_key();
    let challenge = app.challenge_for("iphone-verified").await;
    let object = attestation_object(&key, &challenge, &f, Bad::None);
    let attested = app
        .attest(&apple(
            "iphone-verified",
            &challenge,
            &key,
            "attestation_object",
            object,
        ))
        .await;
    assert_eq!(attested.status(), StatusCode::OK);
    let challenge = app.challenge_for("iphone-verified").await;
    app.rejected(
        &decoded(
            "iphone-verified",
            &challenge,
            verdict(&challenge, app.now(), &[], &f),
        ),
        "device_bound",
    )
    .await;
    let stored: Value = app
        .get("/v1/attestations/iphone-verified", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(stored["level"], "strong");
}
