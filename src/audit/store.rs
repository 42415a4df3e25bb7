//! SQL of the audit log (portable between Postgres and SQLite).

use super::{Actor, Entry, Query};
use crate::store::with_pool;
use crate::store::{Durable, Error};

const INSERT: &str = "INSERT INTO audit_log \
    (id, at, actor_id, actor_name, actor_role, action, target, details, request_id) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

// `$1 IS NULL OR …` keeps one statement for every filter combination; both planners
// fold the constant branch.
const LIST: &str = "SELECT id, at, actor_id, actor_name, actor_role, action, target, details, request_id \
    FROM audit_log \
    WHERE ($1 IS NULL OR action = $1) AND ($2 IS NULL OR id < $2) \
    ORDER BY id DESC LIMIT $3";

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    at: i64,
    actor_id: String,
    actor_name: String,
    actor_role: String,
    action: String,
    target: String,
    details: String,
    request_id: String,
}

pub(super) async fn insert(durable: &Durable, entry: &Entry) -> Result<(), Error> {
    let details = entry.details.to_string();
    with_pool!(durable, |pool| sqlx::query(INSERT)
        .bind(&entry.id)
        .bind(entry.at_ms)
        .bind(&entry.actor.id)
        .bind(&entry.actor.name)
        .bind(&entry.actor.role)
        .bind(&entry.action)
        .bind(&entry.target)
        .bind(&details)
        .bind(&entry.request_id)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

pub(super) async fn list(
    durable: &Durable,
    query: &Query,
    limit: u32,
) -> Result<Vec<Entry>, Error> {
    let before = query.before.map(|id| id.to_string());
    let rows: Vec<Row> = with_pool!(durable, |pool| sqlx::query_as(LIST)
        .bind(query.action.as_deref())
        .bind(before.as_deref())
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await)?;
    Ok(rows
        .into_iter()
        .map(|row| Entry {
            id: row.id,
            at_ms: row.at,
            actor: Actor {
                id: row.actor_id,
                name: row.actor_name,
                role: row.actor_role,
            },
            action: row.action,
            target: row.target,
            details: serde_json::from_str(&row.details).unwrap_or(serde_json::Value::Null),
            request_id: row.request_id,
        })
        .collect())
}
