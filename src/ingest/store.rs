//! SQL of auth events (portable between Postgres and SQLite).

use sqlx::QueryBuilder;

use super::AuthEvent;
use crate::store::{Durable, Error, Pool};
use crate::with_pool;

const PRUNE: &str = "DELETE FROM auth_events WHERE ts < $1";

/// Rows per SQLite INSERT statement: 9 parameters each stays under its 32766 limit.
const ROWS_PER_STATEMENT: usize = 1000;

/// Postgres takes a batch as one array per column: one statement with nine parameters
/// whatever the batch size (a multi-row VALUES list has 9 per row to send, parse and bind).
///
/// A batch is first inserted as is: a batch that is not a retry holds only new ids, and a
/// plain insert costs Postgres about two thirds of one with `ON CONFLICT` (one index probe
/// less per row; 100k rows: 1.44 s against 2.11 s). If any id was stored before, that
/// statement fails as a whole and the batch goes again with `ON CONFLICT DO NOTHING`.
const INSERT_AUTH_PG: &str = "INSERT INTO auth_events \
    (event_id, kind, account, ip, device_id, endpoint, ts, account_received, received_at) \
    SELECT e.*, $9 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
    $6::text[], $7::int8[], $8::text[]) AS e";
const INSERT_AUTH_PG_RETRY: &str = "INSERT INTO auth_events \
    (event_id, kind, account, ip, device_id, endpoint, ts, account_received, received_at) \
    SELECT e.*, $9 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
    $6::text[], $7::int8[], $8::text[]) AS e ON CONFLICT (event_id) DO NOTHING";

/// Inserts the events in one statement (Postgres) or one transaction (SQLite), skipping ids
/// already stored; returns how many rows were new. The database decides duplicates.
pub(super) async fn insert_auth(
    durable: &Durable,
    events: &[AuthEvent],
    received_at: i64,
) -> Result<u64, Error> {
    if events.is_empty() {
        return Ok(0);
    }
    let inserted = match durable.pool() {
        Pool::Postgres(pool) => {
            let column = |f: fn(&AuthEvent) -> &str| events.iter().map(f).collect::<Vec<_>>();
            let optional = |f: fn(&AuthEvent) -> Option<&str>| {
                events.iter().map(f).collect::<Vec<Option<&str>>>()
            };
            let ips: Vec<String> = events
                .iter()
                .map(|e| e.context.ip.addr().to_string())
                .collect();
            let ts: Vec<i64> = events.iter().map(|e| e.ts_ms).collect();
            let (ids, kinds, accounts) = (
                column(|e| &e.event_id),
                column(|e| e.kind.as_str()),
                column(|e| &e.context.account_name),
            );
            let (devices, endpoints, spellings) = (
                optional(|e| e.device_id.as_deref()),
                optional(|e| e.endpoint.as_deref()),
                optional(|e| e.account_received.as_deref()),
            );
            let insert = |sql| {
                sqlx::query(sql)
                    .bind(&ids[..])
                    .bind(&kinds[..])
                    .bind(&accounts[..])
                    .bind(&ips[..])
                    .bind(&devices[..])
                    .bind(&endpoints[..])
                    .bind(&ts[..])
                    .bind(&spellings[..])
                    .bind(received_at)
                    .execute(pool)
            };
            durable
                .within(async {
                    match insert(INSERT_AUTH_PG).await {
                        Ok(done) => Ok(done.rows_affected()),
                        Err(err) if crate::store::is_unique_violation(&err) => {
                            Ok(insert(INSERT_AUTH_PG_RETRY).await?.rows_affected())
                        }
                        Err(err) => Err(err),
                    }
                })
                .await?
        }
        Pool::Sqlite(pool) => durable.within(async {
            let mut tx = pool.begin().await?;
            let mut inserted = 0u64;
            for chunk in events.chunks(ROWS_PER_STATEMENT) {
                let mut builder = QueryBuilder::new(
                    "INSERT INTO auth_events (event_id, kind, account, ip, device_id, endpoint, ts, account_received, received_at) ",
                );
                builder.push_values(chunk, |mut row, event| {
                    row.push_bind(event.event_id.as_str())
                        .push_bind(event.kind.as_str())
                        .push_bind(event.context.account_name.as_str())
                        .push_bind(event.context.ip.addr().to_string())
                        .push_bind(event.device_id.as_deref())
                        .push_bind(event.endpoint.as_deref())
                        .push_bind(event.ts_ms)
                        .push_bind(event.account_received.as_deref())
                        .push_bind(received_at);
                });
                builder.push(" ON CONFLICT (event_id) DO NOTHING");
                inserted += builder.build().execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
            Ok(inserted)
        }).await?,
    };
    Ok(inserted)
}

/// Pruning is background work on possibly many rows: it may take longer than a request may
/// wait for the database.
const PRUNE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

pub(super) async fn prune(durable: &Durable, older_than_ms: i64) -> Result<u64, Error> {
    let deleted = with_pool!(&durable.with_timeout(PRUNE_TIMEOUT), |pool| sqlx::query(
        PRUNE
    )
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
    let deleted = with_pool!(&durable.with_timeout(PRUNE_TIMEOUT), |pool| sqlx::query(
        PRUNE_BATCHES
    )
    .bind(older_than_ms)
    .execute(pool)
    .await
    .map(|done| done.rows_affected()))?;
    Ok(deleted)
}
