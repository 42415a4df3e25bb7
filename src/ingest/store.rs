//! SQL of auth events (portable between Postgres and SQLite).

use sqlx::QueryBuilder;

use super::AuthEvent;
use crate::store::{Durable, Error};
use crate::with_pool;

const PRUNE: &str = "DELETE FROM auth_events WHERE ts < $1";

/// Rows per INSERT statement: 8 parameters each stays under SQLite's 32766 and Postgres'
/// 65535 parameter limits.
const ROWS_PER_STATEMENT: usize = 1000;

/// Inserts the events in one transaction, skipping ids already stored; returns how many
/// rows were new. One multi-row statement per 1000 events: the database decides duplicates.
pub(super) async fn insert_auth(
    durable: &Durable,
    events: &[AuthEvent],
    received_at: i64,
) -> Result<u64, Error> {
    if events.is_empty() {
        return Ok(0);
    }
    let inserted = with_pool!(durable, |pool| {
        let mut tx = pool.begin().await?;
        let mut inserted = 0u64;
        for chunk in events.chunks(ROWS_PER_STATEMENT) {
            let mut builder = QueryBuilder::new(
                "INSERT INTO auth_events (event_id, kind, account, ip, device_id, endpoint, ts, received_at) ",
            );
            builder.push_values(chunk, |mut row, event| {
                row.push_bind(event.event_id.as_str())
                    .push_bind(event.kind.as_str())
                    .push_bind(event.context.account_name.as_str())
                    .push_bind(event.context.ip.addr().to_string())
                    .push_bind(event.device_id.as_deref())
                    .push_bind(event.endpoint.as_deref())
                    .push_bind(event.ts_ms)
                    .push_bind(received_at);
            });
            builder.push(" ON CONFLICT (event_id) DO NOTHING");
            inserted += builder.build().execute(&mut *tx).await?.rows_affected();
        }
        tx.commit().await?;
        Ok::<u64, sqlx::Error>(inserted)
    })?;
    Ok(inserted)
}

pub(super) async fn prune(durable: &Durable, older_than_ms: i64) -> Result<u64, Error> {
    let deleted = with_pool!(durable, |pool| sqlx::query(PRUNE)
        .bind(older_than_ms)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(deleted)
}

const INSERT_BATCH: &str = "INSERT INTO request_batches (id, received_at, events, body) \
    VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING";
const PRUNE_BATCHES: &str = "DELETE FROM request_batches WHERE received_at < $1";

/// Stores a telemetry batch as one row; false if a batch with this id was stored before.
pub(super) async fn insert_request_batch(
    durable: &Durable,
    id: &str,
    received_at: i64,
    events: usize,
    body: &str,
) -> Result<bool, Error> {
    let inserted = with_pool!(durable, |pool| sqlx::query(INSERT_BATCH)
        .bind(id)
        .bind(received_at)
        .bind(i64::try_from(events).unwrap_or(i64::MAX))
        .bind(body)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(inserted == 1)
}

pub(super) async fn prune_request_batches(
    durable: &Durable,
    older_than_ms: i64,
) -> Result<u64, Error> {
    let deleted = with_pool!(durable, |pool| sqlx::query(PRUNE_BATCHES)
        .bind(older_than_ms)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(deleted)
}
