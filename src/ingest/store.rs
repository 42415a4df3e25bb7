//! SQL of auth events (portable between Postgres and SQLite).

use sqlx::QueryBuilder;

use super::AuthEvent;
use crate::store::with_pool;
use crate::store::{Durable, Error, Pool};

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

const STORED_PG: &str = "SELECT event_id, kind, account, ip, device_id, endpoint, ts \
    FROM auth_events WHERE event_id = ANY($1)";

/// An event as stored, to compare a retry with.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(super) struct StoredEvent {
    pub(super) event_id: String,
    pub(super) kind: String,
    pub(super) account: String,
    pub(super) ip: String,
    pub(super) device_id: Option<String>,
    pub(super) endpoint: Option<String>,
    pub(super) ts: i64,
}

/// What an insert did.
#[derive(Debug)]
pub(super) enum Inserted {
    /// Stored; this many rows were new (the others are exact retries).
    Stored(u64),
    /// Nothing stored: the events (index in the batch) that reuse an id stored with other
    /// content, and the indexes of the batch's new events (not stored before).
    Conflicts(Vec<(usize, StoredEvent)>, Vec<usize>),
}

/// The answer for a batch some of whose ids are stored: None when each is a retry, else the
/// conflicts (events whose id is stored with other content) and the batch's new events.
fn conflicts(events: &[AuthEvent], stored: Vec<StoredEvent>) -> Option<Inserted> {
    let by_id: std::collections::HashMap<&str, usize> = events
        .iter()
        .enumerate()
        .map(|(i, e)| (e.event_id.as_str(), i))
        .collect();
    let mut seen = vec![false; events.len()];
    let mut found: Vec<(usize, StoredEvent)> = Vec::new();
    for row in stored {
        let Some(&index) = by_id.get(row.event_id.as_str()) else {
            continue;
        };
        seen[index] = true;
        if super::differences(&events[index], &row).is_some() {
            found.push((index, row));
        }
    }
    if found.is_empty() {
        return None;
    }
    found.sort_by_key(|(index, _)| *index);
    let new = (0..events.len()).filter(|&i| !seen[i]).collect();
    Some(Inserted::Conflicts(found, new))
}

/// Inserts the events in one statement (Postgres) or one transaction (SQLite). An id stored
/// before is a retry when its content is the same (skipped), a conflict when it is not:
/// then nothing of the batch is stored and the conflicts are returned.
pub(super) async fn insert_auth(
    durable: &Durable,
    events: &[AuthEvent],
    received_at: i64,
) -> Result<Inserted, Error> {
    if events.is_empty() {
        return Ok(Inserted::Stored(0));
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
                        Ok(done) => Ok(Inserted::Stored(done.rows_affected())),
                        // Some id was stored before (the statement stored nothing): each is
                        // a retry or a conflict.
                        Err(err) if crate::store::is_unique_violation(&err) => {
                            let stored: Vec<StoredEvent> = sqlx::query_as(STORED_PG)
                                .bind(&ids[..])
                                .fetch_all(pool)
                                .await?;
                            if let Some(refused) = conflicts(events, stored) {
                                return Ok(refused);
                            }
                            let done = insert(INSERT_AUTH_PG_RETRY).await?;
                            Ok(Inserted::Stored(done.rows_affected()))
                        }
                        Err(err) => Err(err),
                    }
                })
                .await?
        }
        Pool::Sqlite(pool) => durable.within(async {
            // The write lock first: the batch reads its stored ids, then writes, and a read
            // transaction that turns into a write fails if another writer went meanwhile.
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            let mut stored = Vec::new();
            for chunk in events.chunks(ROWS_PER_STATEMENT) {
                let mut builder = QueryBuilder::new(
                    "SELECT event_id, kind, account, ip, device_id, endpoint, ts FROM auth_events WHERE event_id IN (",
                );
                let mut ids = builder.separated(", ");
                for event in chunk {
                    ids.push_bind(event.event_id.as_str());
                }
                builder.push(")");
                stored.extend(builder.build_query_as::<StoredEvent>().fetch_all(&mut *tx).await?);
            }
            if let Some(refused) = conflicts(events, stored) {
                return Ok(refused);
            }
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
            Ok(Inserted::Stored(inserted))
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

/// Events a hot-store rebuild replays: successes and passed challenges (known contexts) from
/// `successes_since`, failures from `failures_since`, after `(ts, event_id)`, oldest first.
const REPLAY: &str = "SELECT event_id, kind, account, ip, device_id, endpoint, ts FROM auth_events \
    WHERE ts >= $1 AND (ts, event_id) > ($2, $3) \
      AND (kind <> 'login_failure' OR ts >= $4) \
    ORDER BY ts, event_id LIMIT $5";

/// A page of the events a rebuild of the hot store's windows replays (see [`REPLAY`]).
pub(super) async fn replay_page(
    durable: &Durable,
    successes_since: i64,
    failures_since: i64,
    after: (i64, &str),
    limit: u32,
) -> Result<Vec<StoredEvent>, Error> {
    Ok(with_pool!(durable, |pool| sqlx::query_as(REPLAY)
        .bind(successes_since.min(failures_since))
        .bind(after.0)
        .bind(after.1)
        .bind(failures_since)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await)?)
}
