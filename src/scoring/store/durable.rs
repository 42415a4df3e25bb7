//! The truth behind the stored factors: a row per subject and factor in the durable store
//! (`factors`), written with the hot store's hash, read back by [`crate::scoring::Engine::restore`]
//! when the hot store has lost its data. The hot store stays the one enforcement reads.

use std::collections::BTreeMap;

use super::Change;
use crate::model::SubjectKey;
use crate::scoring::Factor;
use crate::store::{Durable, Error, with_pool};

/// Rows per statement: four parameters each, well under SQLite's 32766.
const ROWS_PER_STATEMENT: usize = 1000;

const PRUNE: &str = "DELETE FROM factors WHERE expires_at IS NOT NULL AND expires_at <= $1";
/// A page after `(subject, id)`. The row comparison is what lets the primary key's index
/// start at the cursor: spelled as an `OR` of the two columns' comparisons, Postgres walks
/// the index from its start and filters, so each page costs what every page before it did.
const LIVE: &str = "SELECT subject, id, body FROM factors \
    WHERE (expires_at IS NULL OR expires_at > $1) AND (subject, id) > ($2, $3) \
    ORDER BY subject, id LIMIT $4";

/// One subject's changes as the rows they leave: per factor id, the factor to store (None:
/// delete the row). Later changes win; a factor already expired at `now_ms` is deleted.
fn final_rows(changes: &[Change], now_ms: i64) -> BTreeMap<String, Option<&Factor>> {
    let mut rows = BTreeMap::new();
    for change in changes {
        match change {
            Change::Set(factor) => {
                rows.insert(factor.id(), (!factor.has_expired(now_ms)).then_some(factor));
            }
            Change::Delete(id) => {
                rows.insert(id.clone(), None);
            }
        }
    }
    rows
}

/// Writes the changes of distinct subjects: the sets in multi-row upserts, the deletes in
/// one statement per thousand, all in one transaction.
pub(crate) async fn write(
    durable: &Durable,
    items: &[(&SubjectKey, &[Change])],
    now_ms: i64,
) -> Result<(), Error> {
    let mut sets: Vec<(&str, String, String, Option<i64>)> = Vec::new();
    let mut deletes: Vec<(&str, String)> = Vec::new();
    for (subject, changes) in items {
        for (id, factor) in final_rows(changes, now_ms) {
            match factor {
                Some(factor) => sets.push((
                    subject.as_str(),
                    id,
                    serde_json::to_string(factor).expect("a factor serialises"),
                    factor.expires_at_ms,
                )),
                None => deletes.push((subject.as_str(), id)),
            }
        }
    }
    if sets.is_empty() && deletes.is_empty() {
        return Ok(());
    }
    with_pool!(durable, |pool| {
        async {
        let mut tx = pool.begin().await?;
        for chunk in sets.chunks(ROWS_PER_STATEMENT) {
            let mut builder =
                sqlx::QueryBuilder::new("INSERT INTO factors (subject, id, body, expires_at) ");
            builder.push_values(chunk, |mut row, (subject, id, body, expires)| {
                row.push_bind(*subject)
                    .push_bind(id.as_str())
                    .push_bind(body.as_str())
                    .push_bind(*expires);
            });
            builder.push(
                " ON CONFLICT (subject, id) DO UPDATE SET body = excluded.body, expires_at = excluded.expires_at",
            );
            builder.build().execute(&mut *tx).await?;
        }
        for chunk in deletes.chunks(ROWS_PER_STATEMENT) {
            let mut builder = sqlx::QueryBuilder::new("DELETE FROM factors WHERE ");
            for (i, (subject, id)) in chunk.iter().enumerate() {
                if i > 0 {
                    builder.push(" OR ");
                }
                builder.push("(subject = ");
                builder.push_bind(*subject);
                builder.push(" AND id = ");
                builder.push_bind(id.as_str());
                builder.push(")");
            }
            builder.build().execute(&mut *tx).await?;
        }
        tx.commit().await
    }
    .await
    })?;
    Ok(())
}

/// A page of the live factors (unexpired at `now_ms`) after `(subject, id)`, in that order:
/// subject, factor id, factor. A row whose subject or body does not parse (not written by
/// this version) is skipped with a warning.
pub(crate) async fn live(
    durable: &Durable,
    now_ms: i64,
    after: (&str, &str),
    limit: u32,
) -> Result<Vec<(SubjectKey, String, Factor)>, Error> {
    let rows: Vec<(String, String, String)> = with_pool!(durable, |pool| sqlx::query_as(LIVE)
        .bind(now_ms)
        .bind(after.0)
        .bind(after.1)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await)?;
    Ok(rows
        .into_iter()
        .filter_map(|(subject, id, body)| {
            let parsed =
                SubjectKey::from_text(&subject).zip(serde_json::from_str::<Factor>(&body).ok());
            if parsed.is_none() {
                tracing::warn!(
                    subject,
                    factor.id = id,
                    "a stored factor does not parse: skipped"
                );
            }
            parsed.map(|(key, factor)| (key, id, factor))
        })
        .collect())
}

const OF_SUBJECT: &str = "SELECT body FROM factors \
    WHERE subject = $1 AND (expires_at IS NULL OR expires_at > $2) ORDER BY id";

/// The live factors of one subject (unexpired at `now_ms`), by id; a body that does not
/// parse is skipped, as in [`live`].
pub(crate) async fn of_subject(
    durable: &Durable,
    subject: &str,
    now_ms: i64,
) -> Result<Vec<Factor>, Error> {
    let rows: Vec<(String,)> = with_pool!(durable, |pool| sqlx::query_as(OF_SUBJECT)
        .bind(subject)
        .bind(now_ms)
        .fetch_all(pool)
        .await)?;
    Ok(rows
        .into_iter()
        .filter_map(|(body,)| serde_json::from_str(&body).ok())
        .collect())
}

/// Deletes the factors expired at `now_ms`; how many.
pub(crate) async fn prune(durable: &Durable, now_ms: i64) -> Result<u64, Error> {
    Ok(with_pool!(durable, |pool| sqlx::query(PRUNE)
        .bind(now_ms)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?)
}
