//! SQL of lockouts (portable between Postgres and SQLite).

use super::{Lockout, LockoutEvent, Query, Status};
use crate::store::with_pool;
use crate::store::{Durable, Error, Pool};

const EXISTS: &str = "SELECT COUNT(*) FROM lockouts WHERE id = $1";
/// Rows per multi-row statement: at most eight parameters each, under SQLite's 32766 limit.
const ROWS_PER_STATEMENT: usize = 1000;
const INSERT_LOCKOUTS_PG: &str = "INSERT INTO lockouts \
    (id, account, scope, reason, failures, level, created_at, locked_until) \
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], \
    $6::int8[], $7::int8[], $8::int8[]) ON CONFLICT (id) DO NOTHING";
const INSERT_LOCKOUT_EVENTS_PG: &str = "INSERT INTO lockout_events (lockout_id, event_id) \
    SELECT * FROM UNNEST($1::text[], $2::text[]) ON CONFLICT DO NOTHING";
const GET: &str = "SELECT id, account, scope, reason, failures, level, created_at, locked_until, released_at, released_by, release_reason \
    FROM lockouts WHERE id = $1";
const RELEASE: &str = "UPDATE lockouts SET released_at = $2, released_by = $3, release_reason = $4 \
    WHERE id = $1 AND released_at IS NULL";
const EVENTS: &str = "SELECT e.event_id, e.kind, e.account, e.account_received, e.ip, \
    e.device_id, e.endpoint, e.ts \
    FROM lockout_events l JOIN auth_events e ON e.event_id = l.event_id \
    WHERE l.lockout_id = $1 ORDER BY e.ts";

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    account: String,
    scope: String,
    reason: String,
    failures: i64,
    level: i64,
    created_at: i64,
    locked_until: i64,
    released_at: Option<i64>,
    released_by: Option<String>,
    release_reason: Option<String>,
}

impl From<Row> for Lockout {
    fn from(row: Row) -> Self {
        Lockout {
            id: row.id,
            account: row.account,
            scope: row.scope,
            reason: row.reason,
            failures: u32::try_from(row.failures).unwrap_or(0),
            level: u32::try_from(row.level).unwrap_or(0),
            created_at_ms: row.created_at,
            locked_until_ms: row.locked_until,
            released_at_ms: row.released_at,
            released_by: row.released_by,
            release_reason: row.release_reason,
        }
    }
}

/// True when a lockout with this id is stored.
pub(super) async fn exists(durable: &Durable, id: &str) -> Result<bool, Error> {
    let count: i64 = with_pool!(durable, |pool| sqlx::query_scalar(EXISTS)
        .bind(id)
        .fetch_one(pool)
        .await)?;
    Ok(count > 0)
}

/// Stores lockouts and the events that led to each, all in one transaction; a lockout
/// already stored under the same id (an orphaned marker adopted while its writer was only
/// slow) is kept as it is.
pub(super) async fn insert_all(
    durable: &Durable,
    lockouts: &[(&Lockout, &[String])],
) -> Result<(), Error> {
    if lockouts.is_empty() {
        return Ok(());
    }
    let events: Vec<(&str, &str)> = lockouts
        .iter()
        .flat_map(|(lockout, ids)| ids.iter().map(|id| (lockout.id.as_str(), id.as_str())))
        .collect();
    let pool = match durable.pool() {
        Pool::Postgres(pool) => {
            // One statement per table, each column an array: a lockout wave stores ten event
            // rows per lockout, and multi-row VALUES lists of 1000 rows (2000 parameters to
            // send, parse and bind) were most of Postgres's time in it.
            let column = |f: fn(&Lockout) -> &str| -> Vec<&str> {
                lockouts.iter().map(|(lockout, _)| f(lockout)).collect()
            };
            let number = |f: fn(&Lockout) -> i64| -> Vec<i64> {
                lockouts.iter().map(|(lockout, _)| f(lockout)).collect()
            };
            let (event_lockouts, event_ids): (Vec<&str>, Vec<&str>) = events.into_iter().unzip();
            return durable
                .within(async {
                    let mut tx = pool.begin().await?;
                    sqlx::query(INSERT_LOCKOUTS_PG)
                        .bind(column(|l| &l.id))
                        .bind(column(|l| &l.account))
                        .bind(column(|l| &l.scope))
                        .bind(column(|l| &l.reason))
                        .bind(number(|l| i64::from(l.failures)))
                        .bind(number(|l| i64::from(l.level)))
                        .bind(number(|l| l.created_at_ms))
                        .bind(number(|l| l.locked_until_ms))
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(INSERT_LOCKOUT_EVENTS_PG)
                        .bind(event_lockouts)
                        .bind(event_ids)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await
                })
                .await;
        }
        Pool::Sqlite(pool) => pool,
    };
    durable.within(async {
    let mut tx = pool.begin().await?;
    for chunk in lockouts.chunks(ROWS_PER_STATEMENT) {
        let mut builder = sqlx::QueryBuilder::new(
            "INSERT INTO lockouts (id, account, scope, reason, failures, level, created_at, locked_until) ",
        );
        builder.push_values(chunk, |mut row, (lockout, _)| {
            row.push_bind(&lockout.id)
                .push_bind(&lockout.account)
                .push_bind(&lockout.scope)
                .push_bind(&lockout.reason)
                .push_bind(i64::from(lockout.failures))
                .push_bind(i64::from(lockout.level))
                .push_bind(lockout.created_at_ms)
                .push_bind(lockout.locked_until_ms);
        });
        builder.push(" ON CONFLICT (id) DO NOTHING");
        builder.build().execute(&mut *tx).await?;
    }
    for chunk in events.chunks(ROWS_PER_STATEMENT) {
        let mut builder =
            sqlx::QueryBuilder::new("INSERT INTO lockout_events (lockout_id, event_id) ");
        builder.push_values(chunk, |mut row, (lockout_id, event_id)| {
            row.push_bind(*lockout_id).push_bind(*event_id);
        });
        builder.push(" ON CONFLICT DO NOTHING");
        builder.build().execute(&mut *tx).await?;
    }
    tx.commit().await
    }).await
}

/// Accounts per statement of the batched queries below (one bind each).
const ACCOUNTS_PER_STATEMENT: usize = 500;

/// `(?, ?, …)`: one bind per item, on either database.
fn push_list<DB: sqlx::Database>(builder: &mut sqlx::QueryBuilder<DB>, items: &[&str])
where
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    builder.push("(");
    let mut list = builder.separated(", ");
    for item in items {
        list.push_bind(*item);
    }
    builder.push(")");
}

/// Per account (of `accounts`), the ids of its failures received since `since_ms` and since
/// its last release (a release clears the window; windows count by receipt), at most
/// `limit` (the newest), oldest first: the
/// events a new lockout refers to. One statement per 500 accounts (a lockout wave locks a
/// batch's accounts together, and this was a query per account).
pub(super) async fn window_failures(
    durable: &Durable,
    accounts: &[&str],
    since_ms: i64,
    limit: usize,
) -> Result<std::collections::HashMap<String, Vec<String>>, Error> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut out: std::collections::HashMap<String, Vec<String>> = Default::default();
    for chunk in accounts.chunks(ACCOUNTS_PER_STATEMENT) {
        // Built in each arm: a query builder is typed by its database.
        let rows: Vec<(String, String)> = with_pool!(durable, |pool| {
            let mut builder = sqlx::QueryBuilder::new(
                "SELECT account, event_id FROM (SELECT e.account, e.event_id, e.ts, \
                 ROW_NUMBER() OVER (PARTITION BY e.account ORDER BY e.ts DESC, e.event_id DESC) \
                 AS n FROM auth_events e WHERE e.kind = 'login_failure' AND e.received_at >= ",
            );
            builder.push_bind(since_ms);
            builder.push(
                " AND e.received_at >= COALESCE((SELECT MAX(l.released_at) FROM lockouts l \
                 WHERE l.account = e.account), 0) AND e.account IN ",
            );
            push_list(&mut builder, chunk);
            builder.push(") w WHERE n <= ");
            builder.push_bind(limit);
            builder.push(" ORDER BY account, ts, event_id");
            builder.build_query_as().fetch_all(pool).await
        })?;
        for (account, event_id) in rows {
            out.entry(account).or_default().push(event_id);
        }
    }
    Ok(out)
}

/// Per account (of `accounts`), its lockouts created since `since_ms` (accounts with none
/// are left out). One statement per 500 accounts.
pub(super) async fn recent_counts(
    durable: &Durable,
    accounts: &[&str],
    since_ms: i64,
) -> Result<std::collections::HashMap<String, u32>, Error> {
    let mut out = std::collections::HashMap::new();
    for chunk in accounts.chunks(ACCOUNTS_PER_STATEMENT) {
        let rows: Vec<(String, i64)> = with_pool!(durable, |pool| {
            let mut builder = sqlx::QueryBuilder::new(
                "SELECT account, COUNT(*) FROM lockouts WHERE created_at >= ",
            );
            builder.push_bind(since_ms);
            builder.push(" AND account IN ");
            push_list(&mut builder, chunk);
            builder.push(" GROUP BY account");
            builder.build_query_as().fetch_all(pool).await
        })?;
        out.extend(
            rows.into_iter()
                .map(|(account, count)| (account, u32::try_from(count).unwrap_or(u32::MAX))),
        );
    }
    Ok(out)
}

pub(super) async fn get(durable: &Durable, id: &str) -> Result<Option<Lockout>, Error> {
    let row: Option<Row> = with_pool!(durable, |pool| sqlx::query_as(GET)
        .bind(id)
        .fetch_optional(pool)
        .await)?;
    Ok(row.map(Lockout::from))
}

/// At most this many distinct addresses seen in auth events may fall in a searched network.
pub(super) const MAX_ADDRESSES: usize = 10_000;

/// The `LIKE` pattern every address of `net` matches in its canonical text form (and few
/// others): the leading groups the prefix covers in full, up to the first zero group of an
/// IPv6 network (the text form may compress the zeros after it).
fn text_prefix(net: &ipnetwork::IpNetwork) -> String {
    match net {
        ipnetwork::IpNetwork::V4(v4) if v4.prefix() == 32 => v4.ip().to_string(),
        ipnetwork::IpNetwork::V4(v4) => {
            let octets = v4.network().octets();
            let whole = usize::from(v4.prefix() / 8);
            let mut text: String = octets[..whole].iter().map(|o| format!("{o}.")).collect();
            text.push('%');
            text
        }
        ipnetwork::IpNetwork::V6(v6) if v6.prefix() == 128 => v6.ip().to_string(),
        ipnetwork::IpNetwork::V6(v6) => {
            let groups = v6.network().segments();
            let whole = usize::from(v6.prefix() / 16);
            let mut text: String = groups[..whole]
                .iter()
                .take_while(|g| **g != 0)
                .map(|g| format!("{g:x}:"))
                .collect();
            text.push('%');
            text
        }
    }
}

/// At most this many distinct addresses seen in auth events are looked at for one search
/// by ASN.
pub(super) const MAX_SCANNED: usize = 200_000;

/// Why an address search could not be answered.
pub(super) enum Search {
    /// More than [`MAX_ADDRESSES`] matched.
    TooMany,
    /// More than [`MAX_SCANNED`] had to be looked at.
    TooWide,
}

/// The distinct addresses seen in auth events that lie in `net` (at most [`MAX_ADDRESSES`]).
pub(super) async fn addresses_in(
    durable: &Durable,
    net: &ipnetwork::IpNetwork,
) -> Result<Result<Vec<String>, Search>, Error> {
    let whole = if net.is_ipv4() { 32 } else { 128 };
    if net.prefix() == whole {
        return Ok(Ok(vec![net.ip().to_string()]));
    }
    addresses_where(durable, &text_prefix(net), usize::MAX, |addr| {
        net.contains(addr)
    })
    .await
}

/// The distinct addresses seen in auth events whose text matches `pattern` (`LIKE`) and that
/// `keep` accepts, paged by address; at most [`MAX_ADDRESSES`] found and `scan_cap` read.
pub(super) async fn addresses_where(
    durable: &Durable,
    pattern: &str,
    scan_cap: usize,
    keep: impl Fn(std::net::IpAddr) -> bool,
) -> Result<Result<Vec<String>, Search>, Error> {
    let mut found = Vec::new();
    let mut after = String::new();
    let mut scanned = 0usize;
    // Paged by address: a wide pattern may match many addresses outside the network.
    loop {
        let page: Vec<String> = with_pool!(durable, |pool| {
            sqlx::query_scalar(
            "SELECT DISTINCT ip FROM auth_events WHERE ip LIKE $1 AND ip > $2 ORDER BY ip LIMIT 5000"
        )
        .bind(pattern)
        .bind(&after)
        .fetch_all(pool)
        .await
        })?;
        let Some(last) = page.last().cloned() else {
            return Ok(Ok(found));
        };
        scanned += page.len();
        if scanned > scan_cap {
            return Ok(Err(Search::TooWide));
        }
        for ip in page {
            if ip.parse().is_ok_and(&keep) {
                found.push(ip);
                if found.len() > MAX_ADDRESSES {
                    return Ok(Err(Search::TooMany));
                }
            }
        }
        after = last;
    }
}

/// Lockouts matching `query` (its network already resolved to `addresses`), newest first.
pub(super) async fn list(
    durable: &Durable,
    query: &Query,
    addresses: Option<&[String]>,
    now_ms: i64,
    limit: u32,
) -> Result<Vec<Lockout>, Error> {
    let before = query.before.map(|id| id.to_string());
    let rows: Vec<Row> = with_pool!(durable, |pool| {
        let mut builder = sqlx::QueryBuilder::new(
            "SELECT id, account, scope, reason, failures, level, created_at, locked_until, \
             released_at, released_by, release_reason FROM lockouts WHERE 1 = 1",
        );
        match query.status {
            Status::All => {}
            Status::Active => {
                builder.push(" AND released_at IS NULL AND locked_until > ");
                builder.push_bind(now_ms);
            }
            Status::Expired => {
                builder.push(" AND released_at IS NULL AND locked_until <= ");
                builder.push_bind(now_ms);
            }
            Status::Released => {
                builder.push(" AND released_at IS NOT NULL");
            }
        }
        if let Some(account) = &query.account {
            builder.push(" AND account = ").push_bind(account);
        }
        if let Some(reason) = &query.reason {
            builder.push(" AND reason = ").push_bind(reason);
        }
        if let Some(since) = query.since_ms {
            builder.push(" AND created_at >= ").push_bind(since);
        }
        if let Some(until) = query.until_ms {
            builder.push(" AND created_at < ").push_bind(until);
        }
        if let Some(before) = &before {
            builder.push(" AND id < ").push_bind(before);
        }
        if addresses.is_some() || query.device_id.is_some() {
            builder.push(
                " AND EXISTS (SELECT 1 FROM lockout_events le JOIN auth_events e \
                 ON e.event_id = le.event_id WHERE le.lockout_id = lockouts.id",
            );
            if let Some(addresses) = addresses {
                let addresses: Vec<&str> = addresses.iter().map(String::as_str).collect();
                builder.push(" AND e.ip IN ");
                push_list(&mut builder, &addresses);
            }
            if let Some(device) = &query.device_id {
                builder.push(" AND e.device_id = ").push_bind(device);
            }
            builder.push(")");
        }
        builder
            .push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(limit));
        builder.build_query_as().fetch_all(pool).await
    })?;
    Ok(rows.into_iter().map(Lockout::from).collect())
}

/// Moves an unreleased lockout's end; false if it is released (or gone).
pub(super) async fn retime(durable: &Durable, id: &str, until_ms: i64) -> Result<bool, Error> {
    let changed = with_pool!(durable, |pool| sqlx::query(
        "UPDATE lockouts SET locked_until = $2 WHERE id = $1 AND released_at IS NULL"
    )
    .bind(id)
    .bind(until_ms)
    .execute(pool)
    .await
    .map(|done| done.rows_affected()))?;
    Ok(changed > 0)
}

pub(super) async fn release(
    durable: &Durable,
    id: &str,
    at_ms: i64,
    by: &str,
    reason: &str,
) -> Result<bool, Error> {
    let changed = with_pool!(durable, |pool| sqlx::query(RELEASE)
        .bind(id)
        .bind(at_ms)
        .bind(by)
        .bind(reason)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(changed > 0)
}

#[derive(sqlx::FromRow)]
struct EventRow {
    event_id: String,
    kind: String,
    account: String,
    account_received: Option<String>,
    ip: String,
    device_id: Option<String>,
    endpoint: Option<String>,
    ts: i64,
}

pub(super) async fn events(durable: &Durable, id: &str) -> Result<Vec<LockoutEvent>, Error> {
    let rows: Vec<EventRow> = with_pool!(durable, |pool| sqlx::query_as(EVENTS)
        .bind(id)
        .fetch_all(pool)
        .await)?;
    Ok(rows
        .into_iter()
        .map(|r| LockoutEvent {
            event_id: r.event_id,
            kind: r.kind,
            account: r.account,
            account_received: r.account_received,
            ip: r.ip,
            device_id: r.device_id,
            endpoint: r.endpoint,
            ts_ms: r.ts,
        })
        .collect())
}

const ACTIVE_AFTER: &str = "SELECT id, account, scope, reason, failures, level, created_at, locked_until, released_at, released_by, release_reason \
    FROM lockouts WHERE released_at IS NULL AND locked_until > $1 AND id > $2 ORDER BY id LIMIT $3";

/// A page of the lockouts in force at `now_ms` whose id is after `after`, by id.
pub(super) async fn active_after(
    durable: &Durable,
    now_ms: i64,
    after: &str,
    limit: u32,
) -> Result<Vec<Lockout>, Error> {
    let rows: Vec<Row> = with_pool!(durable, |pool| sqlx::query_as(ACTIVE_AFTER)
        .bind(now_ms)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await)?;
    Ok(rows.into_iter().map(Lockout::from).collect())
}

const ACTIVE_FOR: &str = "SELECT id, account, scope, reason, failures, level, created_at, locked_until, released_at, released_by, release_reason \
    FROM lockouts WHERE account = $1 AND released_at IS NULL AND locked_until > $2 ORDER BY locked_until DESC LIMIT 1";

/// The lockout of `account` in force at `now_ms` that ends last, if any.
pub(super) async fn active_for(
    durable: &Durable,
    account: &str,
    now_ms: i64,
) -> Result<Option<Lockout>, Error> {
    let row: Option<Row> = with_pool!(durable, |pool| sqlx::query_as(ACTIVE_FOR)
        .bind(account)
        .bind(now_ms)
        .fetch_optional(pool)
        .await)?;
    Ok(row.map(Lockout::from))
}

const RELEASED_SINCE: &str =
    "SELECT account, MAX(released_at) FROM lockouts WHERE released_at >= $1 GROUP BY account";

/// Per account, its latest release at or after `since_ms`.
pub(super) async fn released_since(
    durable: &Durable,
    since_ms: i64,
) -> Result<Vec<(String, i64)>, Error> {
    Ok(with_pool!(durable, |pool| sqlx::query_as(RELEASED_SINCE)
        .bind(since_ms)
        .fetch_all(pool)
        .await)?)
}
