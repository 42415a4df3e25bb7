//! SQL of the API tokens (portable between Postgres and SQLite).

use super::{Caller, Role, TokenInfo};
use crate::store::with_pool;
use crate::store::{Durable, Error};

const INSERT: &str = "INSERT INTO access_tokens (id, name, role, token_hash, created_at, created_by) \
    VALUES ($1, $2, $3, $4, $5, $6)";
const FIND_ACTIVE_BY_HASH: &str = "SELECT id, name, role, token_hash FROM access_tokens \
    WHERE token_hash = $1 AND revoked_at IS NULL";
const REVOKE: &str = "UPDATE access_tokens SET revoked_at = $2, revoked_by = $3 \
    WHERE id = $1 AND revoked_at IS NULL";
const FIND_BY_ID: &str = "SELECT id, name, role, created_at, created_by, revoked_at \
    FROM access_tokens WHERE id = $1";
const LIST: &str = "SELECT id, name, role, created_at, created_by, revoked_at \
    FROM access_tokens ORDER BY id DESC";
// Revoked ones count: tokens are never deleted, so the retirement is as durable as the table.
const ADMIN_ISSUED: &str = "SELECT COUNT(*) FROM access_tokens WHERE role = 'admin'";

#[derive(sqlx::FromRow)]
struct InfoRow {
    id: String,
    name: String,
    role: String,
    created_at: i64,
    created_by: String,
    revoked_at: Option<i64>,
}

impl From<InfoRow> for TokenInfo {
    fn from(row: InfoRow) -> Self {
        TokenInfo {
            id: row.id,
            name: row.name,
            // The CHECK constraint admits only known roles.
            role: Role::parse(&row.role).unwrap_or(Role::Ingest),
            created_at_ms: row.created_at,
            created_by: row.created_by,
            revoked_at_ms: row.revoked_at,
        }
    }
}

pub(super) async fn insert(
    durable: &Durable,
    info: &TokenInfo,
    token_hash: &str,
) -> Result<(), super::Error> {
    let result = with_pool!(durable, |pool| sqlx::query(INSERT)
        .bind(&info.id)
        .bind(&info.name)
        .bind(info.role.as_str())
        .bind(token_hash)
        .bind(info.created_at_ms)
        .bind(&info.created_by)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()));
    match result {
        Ok(_) => Ok(()),
        Err(err) if crate::store::is_unique_violation(&err) => {
            Err(super::Error::NameTaken(info.name.clone()))
        }
        Err(err) => Err(Error::from(err).into()),
    }
}

pub(super) async fn find_active_by_hash(
    durable: &Durable,
    token_hash: &str,
) -> Result<Option<(String, Caller)>, Error> {
    let row: Option<(String, String, String, String)> =
        with_pool!(durable, |pool| sqlx::query_as(FIND_ACTIVE_BY_HASH)
            .bind(token_hash)
            .fetch_optional(pool)
            .await)?;
    Ok(row.and_then(|(id, name, role, stored_hash)| {
        Role::parse(&role).map(|role| {
            (
                stored_hash,
                Caller {
                    token_id: id.into(),
                    name: name.into(),
                    role,
                },
            )
        })
    }))
}

pub(super) async fn revoke(
    durable: &Durable,
    id: &str,
    at_ms: i64,
    by: &str,
) -> Result<bool, Error> {
    let result = with_pool!(durable, |pool| sqlx::query(REVOKE)
        .bind(id)
        .bind(at_ms)
        .bind(by)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(result > 0)
}

pub(super) async fn find_by_id(durable: &Durable, id: &str) -> Result<Option<TokenInfo>, Error> {
    let row: Option<InfoRow> = with_pool!(durable, |pool| sqlx::query_as(FIND_BY_ID)
        .bind(id)
        .fetch_optional(pool)
        .await)?;
    Ok(row.map(TokenInfo::from))
}

pub(super) async fn list(durable: &Durable) -> Result<Vec<TokenInfo>, Error> {
    let rows: Vec<InfoRow> =
        with_pool!(durable, |pool| sqlx::query_as(LIST).fetch_all(pool).await)?;
    Ok(rows.into_iter().map(TokenInfo::from).collect())
}

/// True when an active (not revoked) admin token exists.
/// True once any admin token was issued (revoked or not).
pub(super) async fn admin_ever_issued(durable: &Durable) -> Result<bool, Error> {
    let count: i64 = with_pool!(durable, |pool| sqlx::query_scalar(ADMIN_ISSUED)
        .fetch_one(pool)
        .await)?;
    Ok(count > 0)
}
