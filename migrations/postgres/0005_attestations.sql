-- Device attestation verdicts (module `attestation`): one row per accepted verdict; a
-- device's level is its newest unexpired row (attestations_device serves that lookup and
-- GET /v1/attestations/{device_id}). Reasons are JSON.
CREATE TABLE attestations (
    id           TEXT PRIMARY KEY,
    device_id    TEXT NOT NULL,
    platform     TEXT NOT NULL,
    level        TEXT NOT NULL,
    reasons      TEXT NOT NULL,
    verified_at  BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);
CREATE INDEX attestations_device ON attestations (device_id, id);

-- App Attest keys, stored at attestation to verify the device's assertions. counter only
-- grows (UPDATE … WHERE counter < $new decides a race between instances: a replayed
-- assertion never passes twice).
CREATE TABLE app_attest_keys (
    key_id       TEXT PRIMARY KEY,
    device_id    TEXT NOT NULL,
    app_id       TEXT NOT NULL,
    public_key   TEXT NOT NULL,
    counter      BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    last_used_at BIGINT NOT NULL
);
