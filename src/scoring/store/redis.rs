//! The Redis factor store (`lua/factors_update.lua`, `lua/multiplier_publish.lua`, one slot
//! per subject; the deployment-wide keys in the `{scoring}` slot).

use std::collections::HashMap;

use futures_util::future::BoxFuture;
use redis::Value;

use super::{
    Change, DUE_BATCH, DecisionChange, Factor, Factors, Page, Record, STREAM_LEN, Stored, Update,
    Updated, Write, stream_id,
};
use crate::model::SubjectKey;
use crate::store::scripts::{FACTORS_UPDATE, MULTIPLIER_PUBLISH};
use crate::store::{Error, Keys, RedisHot};

/// How long a subject's factor hash outlives its last factor (keeps its version).
const KEEP_MS: i64 = 86_400_000;
/// Subjects per `factors_update.lua` call or `MULTI`/`EXEC` on a single Redis: a challenge is
/// 10-20 µs of Redis time, so a call holds other connections up for well under a millisecond.
const SUBJECTS_PER_CALL: usize = 32;

fn bad_reply(message: impl Into<String>) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected scoring reply",
        message.into(),
    )))
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Parses a stored payload; a payload that does not parse is skipped (never a 500).
fn decode(id: &str, payload: &str) -> Option<Factor> {
    match serde_json::from_str(payload) {
        Ok(factor) => Some(factor),
        Err(err) => {
            tracing::warn!(factor.id = id, error.cause = %err, "skipping a stored factor that does not parse");
            None
        }
    }
}

/// Adds a decision stream entry (`XADD`, trimmed to about [`STREAM_LEN`]) to `pipe`.
fn push_decision(pipe: &mut redis::Pipeline, keys: &Keys, change: &DecisionChange) {
    pipe.cmd("XADD")
        .arg(keys.scoring("decisions"))
        .arg("MAXLEN")
        .arg("~")
        .arg(STREAM_LEN)
        .arg("*")
        .arg("d")
        .arg(serde_json::to_string(change).unwrap_or_default())
        .ignore();
}

/// One subject's reply of `factors_update.lua`.
fn updated(reply: &[Value]) -> Result<Updated, Error> {
    let [Value::Int(version), Value::Int(published), rest @ ..] = reply else {
        return Err(bad_reply("factors_update.lua: no version"));
    };
    if *published == 1 {
        return Ok(Updated::Published);
    }
    let mut factors: Vec<Factor> = rest
        .chunks_exact(2)
        .filter_map(|pair| {
            let (id, payload) = (text(&pair[0])?, text(&pair[1])?);
            decode(&id, &payload)
        })
        .collect();
    factors.sort_by_key(Factor::id);
    Ok(Updated::Stored(Stored {
        version: u64::try_from(*version).unwrap_or(0),
        factors,
    }))
}

/// The stored form of a factor in its subject's hash: `<expires_ms>|<json>` (-1: no expiry).
fn stored_value(factor: &Factor) -> Vec<u8> {
    let mut out = factor.expires_at_ms.unwrap_or(-1).to_string().into_bytes();
    out.push(b'|');
    let head = out.len();
    if serde_json::to_writer(&mut out, factor).is_err() {
        // Stored as no payload, which readers skip (as the script path stores "").
        out.truncate(head);
    }
    out
}

/// The expiry of a hash whose last factor never expires: far enough never to come (a hash
/// always has an expiry, so the transaction in [`transacted`] can tell a new hash by its
/// having none).
const FOREVER_MS: i64 = 253_402_300_799_000;

/// The factor of an update that sets one live factor and nothing else.
fn single_set<'a>(update: &Update<'a>, now_ms: i64) -> Option<&'a Factor> {
    match update.changes {
        [Change::Set(factor)] if !factor.has_expired(now_ms) => Some(factor),
        _ => None,
    }
}

/// Updates that each set one live factor, on a single Redis, as transactions of plain
/// commands ([`SUBJECTS_PER_CALL`] subjects each, sent at once): per subject `HINCRBY` of the
/// version, `HSET` of the factor, `SET … NX` of each multiplier its fresh plan writes and
/// `PEXPIREAT … NX` of the hash. A subject whose version comes back 1 and whose multipliers
/// were all written had nothing stored: [`Updated::Published`], as the script answers.
/// Otherwise (None) its factor is stored and the caller reads it back through the script,
/// which publishes nothing: a multiplier `NX` wrote meanwhile (only for a class with nothing
/// published, so no live stored factor applies to it: the value it has with this factor) is
/// overwritten by the caller's publish, and the hash's expiry is set from all its factors
/// (every hash has one, so `NX` only sets that of a new hash).
///
/// Why: a challenge is one factor on an account with nothing stored, and a wave of them is
/// bound by Redis's one thread. The same four commands cost Redis about half as much in a
/// transaction as through the script (`redis.call` and the script's arguments; spare Redis,
/// 600 calls of 32 subjects: 6.7–6.9 against 12.4–13.3 µs per subject).
async fn transacted(
    redis: &RedisHot,
    keys: &Keys,
    now_ms: i64,
    items: &[(Update<'_>, &Factor)],
) -> Result<Vec<Option<Updated>>, Error> {
    let calls = items.chunks(SUBJECTS_PER_CALL).map(|part| async move {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut writes_of = Vec::with_capacity(part.len());
        for (item, factor) in part {
            let hash = keys.factors(item.subject);
            let expires = factor
                .expires_at_ms
                .map_or(FOREVER_MS, |at| at.max(now_ms) + KEEP_MS);
            pipe.cmd("HINCRBY").arg(&hash).arg("_v").arg(1);
            pipe.cmd("HSET")
                .arg(&hash)
                .arg(factor.id())
                .arg(stored_value(factor));
            let (writes, ttl_ms) = item.fresh;
            let mut n = 0;
            for (key, value) in writes {
                let Some(value) = value else { continue };
                let cmd = pipe.cmd("SET").arg(key).arg(value.to_string()).arg("NX");
                if let Some(ttl_ms) = ttl_ms {
                    cmd.arg("PX").arg(ttl_ms);
                }
                n += 1;
            }
            pipe.cmd("PEXPIREAT").arg(&hash).arg(expires).arg("NX");
            writes_of.push(n);
        }
        let replies: Vec<Value> = redis.query_pipeline(&pipe).await?;
        let mut replies = replies.into_iter();
        let mut out = Vec::with_capacity(part.len());
        for n in writes_of {
            let version = match replies.next() {
                Some(Value::Int(version)) => version,
                _ => return Err(bad_reply("transaction: no version")),
            };
            let _stored = replies.next();
            let mut written = true;
            for _ in 0..n {
                match replies.next() {
                    Some(Value::Okay) => {}
                    Some(Value::Nil) => written = false,
                    _ => return Err(bad_reply("transaction: a multiplier's SET")),
                }
            }
            let _expiry = replies.next();
            out.push((version == 1 && written).then_some(Updated::Published));
        }
        Ok::<_, Error>(out)
    });
    let mut out = Vec::with_capacity(items.len());
    for part in futures_util::future::join_all(calls).await {
        out.extend(part?);
    }
    Ok(out)
}

/// Updates through `lua/factors_update.lua`, `per_call` subjects a call, the calls sent at
/// once.
async fn scripted(
    redis: &RedisHot,
    keys: &Keys,
    now_ms: i64,
    items: &[Update<'_>],
    per_call: usize,
) -> Result<Vec<Updated>, Error> {
    let calls = items.chunks(per_call).map(|part| async move {
        let mut redis_keys = Vec::new();
        let mut args = vec![now_ms.to_string(), KEEP_MS.to_string()];
        for item in part {
            redis_keys.push(keys.factors(item.subject));
            // Only the values to write: a subject with nothing stored has no key to delete.
            let (writes, ttl_ms) = item.fresh;
            let writes: Vec<(&String, f64)> = writes
                .iter()
                .filter_map(|(key, value)| Some((key, (*value)?)))
                .collect();
            args.push(writes.len().to_string());
            args.push(item.changes.len().to_string());
            for change in item.changes {
                match change {
                    Change::Set(factor) => {
                        args.push(factor.id());
                        args.push(serde_json::to_string(factor).unwrap_or_default());
                        args.push(factor.expires_at_ms.unwrap_or(-1).to_string());
                    }
                    Change::Delete(id) => {
                        args.push(id.clone());
                        args.push(String::new());
                        args.push("-1".to_owned());
                    }
                }
            }
            for (key, value) in writes {
                redis_keys.push(key.clone());
                args.push(value.to_string());
                args.push(ttl_ms.unwrap_or(0).to_string());
            }
        }
        let replies: Vec<Vec<Value>> = redis.eval(&FACTORS_UPDATE, &redis_keys, &args).await?;
        if replies.len() != part.len() {
            return Err(bad_reply("factors_update.lua: one reply per subject"));
        }
        replies
            .iter()
            .map(|reply| updated(reply))
            .collect::<Result<Vec<_>, _>>()
    });
    let mut out = Vec::with_capacity(items.len());
    for part in futures_util::future::join_all(calls).await {
        out.extend(part?);
    }
    Ok(out)
}

/// Factors on Redis or Redis Cluster, shared by every instance.
#[derive(Debug, Clone)]
pub(super) struct RedisFactors(pub(super) RedisHot);

impl Factors for RedisFactors {
    fn update<'a>(
        &'a self,
        keys: &'a Keys,
        now_ms: i64,
        items: &'a [Update<'a>],
    ) -> BoxFuture<'a, Result<Vec<Updated>, Error>> {
        Box::pin(async move {
            let redis = &self.0;
            if redis.is_cluster() {
                return scripted(redis, keys, now_ms, items, 1).await;
            }
            // A subject given one live factor to set goes in a transaction of plain
            // commands; the rest, and those the transaction found had something stored,
            // through the script.
            let mut quick = Vec::new();
            let mut quick_items = Vec::new();
            let mut scripted_at = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match single_set(item, now_ms) {
                    Some(factor) => {
                        quick.push(i);
                        quick_items.push((*item, factor));
                    }
                    None => scripted_at.push(i),
                }
            }
            let script_items: Vec<Update<'_>> = scripted_at.iter().map(|&i| items[i]).collect();
            let (fast, slow) = tokio::join!(
                transacted(redis, keys, now_ms, &quick_items),
                scripted(redis, keys, now_ms, &script_items, SUBJECTS_PER_CALL),
            );
            let mut out: Vec<Option<Updated>> = vec![None; items.len()];
            let mut stored_before = Vec::new();
            for (&i, outcome) in quick.iter().zip(fast?) {
                match outcome {
                    Some(updated) => out[i] = Some(updated),
                    None => stored_before.push(i),
                }
            }
            for (&i, updated) in scripted_at.iter().zip(slow?) {
                out[i] = Some(updated);
            }
            // Their change is stored: the script (no change) reads their factors back
            // under a new version and sets the hash's expiry from all of them.
            let reads: Vec<Update<'_>> = stored_before
                .iter()
                .map(|&i| Update {
                    changes: &[],
                    fresh: (&[], None),
                    ..items[i]
                })
                .collect();
            for (&i, updated) in stored_before
                .iter()
                .zip(scripted(redis, keys, now_ms, &reads, SUBJECTS_PER_CALL).await?)
            {
                out[i] = Some(updated);
            }
            out.into_iter()
                .map(|updated| updated.ok_or_else(|| bad_reply("a subject without a reply")))
                .collect()
        })
    }

    fn read<'a>(
        &'a self,
        keys: &'a Keys,
        subject: &'a SubjectKey,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<Vec<Factor>, Error>> {
        Box::pin(async move {
            let redis = &self.0;
            let all: HashMap<String, String> = redis
                .query(redis::cmd("HGETALL").arg(keys.factors(subject)))
                .await?;
            let mut factors: Vec<Factor> = all
                .iter()
                .filter(|(id, _)| *id != "_v")
                .filter_map(|(id, value)| {
                    let (_, payload) = value.split_once('|')?;
                    decode(id, payload)
                })
                .filter(|f| !f.has_expired(now_ms))
                .collect();
            factors.sort_by_key(Factor::id);
            Ok(factors)
        })
    }

    fn publish<'a>(
        &'a self,
        keys: &'a Keys,
        subject: &'a SubjectKey,
        version: u64,
        writes: &'a [Write],
        ttl_ms: Option<u64>,
        _now_us: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let redis = &self.0;
            let mut redis_keys = vec![keys.factors(subject)];
            let mut args = vec![version.to_string()];
            for (key, value) in writes {
                redis_keys.push(key.clone());
                args.push(value.map(|v| v.to_string()).unwrap_or_default());
                args.push(ttl_ms.unwrap_or(0).to_string());
            }
            let written: i64 = redis.eval(&MULTIPLIER_PUBLISH, &redis_keys, &args).await?;
            Ok(written == 1)
        })
    }

    fn record<'a>(
        &'a self,
        keys: &'a Keys,
        records: &'a [Record<'a>],
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let redis = &self.0;
            if records.is_empty() {
                return Ok(());
            }
            // Each index's changes in order, a run of adds (or removes) one command: a
            // wave of challenges is hundreds of subjects, each a command of its own before.
            let mut pipe = redis::pipe();
            let (active, due) = (keys.scoring("active"), keys.scoring("due"));
            let mut runs: Vec<(bool, redis::Cmd)> = Vec::new();
            for record in records {
                let adding = record.active.is_some();
                if runs.last().is_none_or(|(kind, _)| *kind != adding) {
                    let mut cmd = redis::cmd(if adding { "ZADD" } else { "ZREM" });
                    cmd.arg(&active);
                    runs.push((adding, cmd));
                }
                if let Some((_, cmd)) = runs.last_mut() {
                    let subject = record.subject.as_str();
                    match record.active {
                        Some(i64::MAX) => cmd.arg("+inf").arg(subject),
                        Some(until) => cmd.arg(until).arg(subject),
                        None => cmd.arg(subject),
                    };
                }
            }
            for (_, cmd) in runs {
                pipe.add_command(cmd).ignore();
            }
            let mut due_at = redis::cmd("ZADD");
            due_at.arg(&due);
            let mut dues = 0;
            for record in records {
                if let Some(at) = record.due_ms {
                    due_at.arg(at).arg(record.subject.as_str());
                    dues += 1;
                }
            }
            if dues > 0 {
                pipe.add_command(due_at).ignore();
            }
            for record in records {
                push_decision(&mut pipe, keys, record.change);
            }
            redis.query_pipeline::<()>(&pipe).await
        })
    }

    fn append_all<'a>(
        &'a self,
        keys: &'a Keys,
        changes: &'a [DecisionChange],
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let redis = &self.0;
            if changes.is_empty() {
                return Ok(());
            }
            let mut pipe = redis::pipe();
            for change in changes {
                push_decision(&mut pipe, keys, change);
            }
            redis.query_pipeline::<()>(&pipe).await
        })
    }

    fn changes<'a>(
        &'a self,
        keys: &'a Keys,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Page, Error>> {
        Box::pin(async move {
            let redis = &self.0;
            let key = keys.scoring("decisions");
            let Some(cursor) = cursor else {
                let last: Vec<(String, HashMap<String, String>)> = redis
                    .query(
                        redis::cmd("XREVRANGE")
                            .arg(&key)
                            .arg("+")
                            .arg("-")
                            .arg("COUNT")
                            .arg(1),
                    )
                    .await?;
                let newest = last
                    .first()
                    .map_or_else(|| "0-0".to_owned(), |(id, _)| id.clone());
                return Ok(Page {
                    next: newest,
                    ..Page::default()
                });
            };
            let cursor = if cursor.contains('-') {
                cursor.to_owned()
            } else {
                format!("{cursor}-0")
            };
            let mut pipe = redis::pipe();
            pipe.cmd("XRANGE")
                .arg(&key)
                .arg(format!("({cursor}"))
                .arg("+")
                .arg("COUNT")
                .arg(limit)
                .cmd("XRANGE")
                .arg(&key)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(1)
                .cmd("XLEN")
                .arg(&key);
            type Entries = Vec<(String, HashMap<String, String>)>;
            let (entries, first, len): (Entries, Entries, u64) =
                redis.query_pipeline(&pipe).await?;
            // Trimmed entries newer than the cursor exist if the stream is at its cap
            // and the cursor is older than the oldest entry kept.
            let reset = first.first().is_some_and(|(oldest, _)| {
                len as usize >= STREAM_LEN * 9 / 10 && stream_id(oldest) > stream_id(&cursor)
            });
            let items: Vec<DecisionChange> = entries
                .into_iter()
                .filter_map(|(id, fields)| {
                    let mut change: DecisionChange = serde_json::from_str(fields.get("d")?).ok()?;
                    change.cursor = id;
                    Some(change)
                })
                .collect();
            let next = items.last().map_or(cursor, |c| c.cursor.clone());
            Ok(Page {
                changes: items,
                next,
                reset,
            })
        })
    }

    fn take_due<'a>(
        &'a self,
        keys: &'a Keys,
        now_ms: i64,
    ) -> BoxFuture<'a, Result<Vec<SubjectKey>, Error>> {
        Box::pin(async move {
            let redis = &self.0;
            let key = keys.scoring("due");
            let candidates: Vec<String> = redis
                .query(
                    redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg("-inf")
                        .arg(now_ms)
                        .arg("BYSCORE")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(DUE_BATCH),
                )
                .await?;
            let mut taken = Vec::new();
            for subject in candidates {
                // ZREM decides who owns it: only one instance removes it.
                let removed: i64 = redis
                    .query(redis::cmd("ZREM").arg(&key).arg(&subject))
                    .await?;
                if removed == 1 {
                    taken.extend(SubjectKey::from_text(&subject));
                }
            }
            Ok(taken)
        })
    }

    fn active<'a>(
        &'a self,
        keys: &'a Keys,
        now_ms: i64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<SubjectKey>, Error>> {
        Box::pin(async move {
            let redis = &self.0;
            let key = keys.scoring("active");
            let mut pipe = redis::pipe();
            pipe.cmd("ZREMRANGEBYSCORE")
                .arg(&key)
                .arg("-inf")
                .arg(now_ms)
                .ignore()
                .cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(limit.saturating_sub(1));
            let (subjects,): (Vec<String>,) = redis.query_pipeline(&pipe).await?;
            Ok(subjects
                .iter()
                .filter_map(|s| SubjectKey::from_text(s))
                .collect())
        })
    }
}
