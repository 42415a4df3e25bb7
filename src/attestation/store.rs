//! SQL of attestation verdicts and App Attest keys (portable between Postgres and SQLite).

use super::Verdict;
use crate::store::with_pool;
use crate::store::{Durable, Error};

const INSERT_VERDICT: &str = "INSERT INTO attestations \
    (id, device_id, platform, level, reasons, verified_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)";
const LATEST: &str = "SELECT id, device_id, platform, level, reasons, verified_at, expires_at \
    FROM attestations WHERE device_id = $1 ORDER BY id DESC LIMIT 1";
const INSERT_KEY: &str = "INSERT INTO app_attest_keys \
    (key_id, device_id, app_id, public_key, counter, created_at, last_used_at, receipt) \
    VALUES ($1, $2, $3, $4, 0, $5, $5, $6) ON CONFLICT (key_id) DO NOTHING";
const KEY: &str =
    "SELECT key_id, device_id, app_id, public_key, counter FROM app_attest_keys WHERE key_id = $1";
const DEVICE_KEY: &str = "SELECT key_id, device_id, app_id, public_key, counter \
    FROM app_attest_keys WHERE device_id = $1 ORDER BY created_at LIMIT 1";
const ADVANCE: &str = "UPDATE app_attest_keys SET counter = $2, last_used_at = $3 \
    WHERE key_id = $1 AND counter < $2";

#[derive(sqlx::FromRow)]
pub(super) struct VerdictRow {
    pub(super) id: String,
    pub(super) device_id: String,
    pub(super) platform: String,
    pub(super) level: String,
    pub(super) reasons: String,
    pub(super) verified_at: i64,
    pub(super) expires_at: i64,
}

/// An attested key.
#[derive(sqlx::FromRow)]
pub(super) struct KeyRow {
    pub(super) key_id: String,
    pub(super) device_id: String,
    /// The app the key was attested for.
    pub(super) app_id: String,
    pub(super) public_key: String,
    pub(super) counter: i64,
}

pub(super) async fn insert_verdict(durable: &Durable, verdict: &Verdict) -> Result<(), Error> {
    let reasons = serde_json::to_string(&verdict.reasons).unwrap_or_else(|_| "[]".to_owned());
    with_pool!(durable, |pool| sqlx::query(INSERT_VERDICT)
        .bind(&verdict.id)
        .bind(&verdict.device_id)
        .bind(&verdict.platform)
        .bind(verdict.level.as_str())
        .bind(&reasons)
        .bind(verdict.verified_at_ms)
        .bind(verdict.expires_at_ms)
        .execute(pool)
        .await
        .map(|_| ()))?;
    Ok(())
}

pub(super) async fn latest(durable: &Durable, device_id: &str) -> Result<Option<Verdict>, Error> {
    let row: Option<VerdictRow> = with_pool!(durable, |pool| sqlx::query_as(LATEST)
        .bind(device_id)
        .fetch_optional(pool)
        .await)?;
    Ok(row.map(Verdict::from_row))
}

/// Stores a newly attested key; false if the key id exists.
pub(super) async fn insert_key(
    durable: &Durable,
    key_id: &str,
    device_id: &str,
    app_id: &str,
    public_key: &str,
    receipt: &str,
    now_ms: i64,
) -> Result<bool, Error> {
    let inserted = with_pool!(durable, |pool| sqlx::query(INSERT_KEY)
        .bind(key_id)
        .bind(device_id)
        .bind(app_id)
        .bind(public_key)
        .bind(now_ms)
        .bind(receipt)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(inserted == 1)
}

pub(super) async fn key(durable: &Durable, key_id: &str) -> Result<Option<KeyRow>, Error> {
    Ok(with_pool!(durable, |pool| sqlx::query_as(KEY)
        .bind(key_id)
        .fetch_optional(pool)
        .await)?)
}

/// The first App Attest key attested for `device_id`, if any.
pub(super) async fn device_key(
    durable: &Durable,
    device_id: &str,
) -> Result<Option<KeyRow>, Error> {
    Ok(with_pool!(durable, |pool| sqlx::query_as(DEVICE_KEY)
        .bind(device_id)
        .fetch_optional(pool)
        .await)?)
}

/// Raises a key's counter to `counter` if it is higher; false if it was not (a replay).
pub(super) async fn advance_counter(
    durable: &Durable,
    key_id: &str,
    counter: i64,
    now_ms: i64,
) -> Result<bool, Error> {
    let updated = with_pool!(durable, |pool| sqlx::query(ADVANCE)
        .bind(key_id)
        .bind(counter)
        .bind(now_ms)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(updated == 1)
}
