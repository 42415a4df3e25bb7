//! The hot side of lockouts: failure windows, lock markers, known IPs/devices, on Redis
//! (`lua/velocity_window.lua`, one call per subject so a cluster sees one slot) or in-process.

use redis::Value;

use crate::model::SubjectKey;
use crate::store::scripts::VELOCITY_WINDOW;
use crate::store::{Error, Hot, Keys};

/// Most entries kept per window (thresholds are validated to be at most this).
pub const WINDOW_CAP: usize = 1000;
/// Most known IPs/devices remembered per account.
pub const KNOWN_CAP: usize = 50;

/// One window to record into (`add`: member and score) or only count.
#[derive(Debug, Clone)]
pub struct WindowOp {
    /// Redis key of the window.
    pub key: String,
    /// `(member, score_ms)` to add.
    pub add: Option<(String, i64)>,
}

/// Per window: count within the window, ms between its two newest entries (if two).
pub type WindowCounts = Vec<(u32, Option<i64>)>;

/// Records into (and counts) windows of one subject, atomically.
pub async fn record(
    hot: &Hot,
    ops: &[WindowOp],
    now_ms: i64,
    window_ms: i64,
    cap: usize,
) -> Result<WindowCounts, Error> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    match hot {
        Hot::Memory(memory) => {
            let keys: Vec<(String, Option<(String, i64)>)> = ops
                .iter()
                .map(|op| (op.key.clone(), op.add.clone()))
                .collect();
            Ok(memory.window_record(&keys, now_ms, window_ms, cap))
        }
        Hot::Redis(redis) => {
            let keys: Vec<String> = ops.iter().map(|op| op.key.clone()).collect();
            let mut args = vec![now_ms.to_string(), window_ms.to_string(), cap.to_string()];
            for op in ops {
                let (member, score) = op.add.clone().unwrap_or_default();
                args.push(member);
                args.push(score.to_string());
            }
            let reply: Vec<Value> = redis.eval(&VELOCITY_WINDOW, &keys, &args).await?;
            let ints: Vec<i64> = reply
                .iter()
                .map(|v| match v {
                    Value::Int(i) => *i,
                    _ => 0,
                })
                .collect();
            Ok(ints
                .chunks_exact(2)
                .map(|pair| {
                    (
                        u32::try_from(pair[0]).unwrap_or(0),
                        (pair[1] >= 0).then_some(pair[1]),
                    )
                })
                .collect())
        }
    }
}

/// Members of a window within `window_ms` of `now_ms`, oldest first.
pub async fn members(
    hot: &Hot,
    key: &str,
    now_ms: i64,
    window_ms: i64,
) -> Result<Vec<String>, Error> {
    match hot {
        Hot::Memory(memory) => Ok(memory
            .window_entries(key, now_ms, window_ms)
            .into_iter()
            .map(|(_, m)| m)
            .collect()),
        Hot::Redis(redis) => {
            let mut cmd = redis::cmd("ZRANGE");
            cmd.arg(key)
                .arg(now_ms - window_ms)
                .arg("+inf")
                .arg("BYSCORE");
            redis.query(&cmd).await
        }
    }
}

/// Deletes windows (release clears the account's counters).
pub async fn clear(hot: &Hot, keys: &[String]) -> Result<(), Error> {
    match hot {
        Hot::Memory(memory) => {
            memory.window_clear(keys);
            Ok(())
        }
        Hot::Redis(redis) => {
            for key in keys {
                redis.query::<()>(redis::cmd("DEL").arg(key)).await?;
            }
            Ok(())
        }
    }
}

/// Sets the account's lock marker unless one exists: true if this call set it (exactly one
/// instance creates a lockout).
pub async fn lock_if_absent(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    lockout_id: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, Error> {
    let key = keys.lock(account);
    match hot {
        Hot::Memory(memory) => Ok(memory.value_set_nx(&key, lockout_id, now_ms, ttl_ms)),
        Hot::Redis(redis) => {
            let set: Option<String> = redis
                .query(
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(lockout_id)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms.max(1)),
                )
                .await?;
            Ok(set.is_some())
        }
    }
}

/// The account's lock marker: lockout id and ms until it expires.
pub async fn lock(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    now_ms: i64,
) -> Result<Option<(String, i64)>, Error> {
    let key = keys.lock(account);
    match hot {
        Hot::Memory(memory) => Ok(memory.value_get(&key, now_ms)),
        Hot::Redis(redis) => {
            let mut pipe = redis::pipe();
            pipe.cmd("GET").arg(&key).cmd("PTTL").arg(&key);
            let (id, ttl): (Option<String>, i64) = redis.query_pipeline(&pipe).await?;
            Ok(id
                .filter(|_| ttl != -2)
                .map(|id| (id, if ttl < 0 { i64::MAX } else { ttl })))
        }
    }
}

/// Removes the lock marker if it still names `lockout_id`.
pub async fn unlock(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    lockout_id: &str,
    now_ms: i64,
) -> Result<(), Error> {
    if lock(hot, keys, account, now_ms)
        .await?
        .is_some_and(|(id, _)| id == lockout_id)
    {
        let key = keys.lock(account);
        match hot {
            Hot::Memory(memory) => memory.value_delete(&key),
            Hot::Redis(redis) => redis.query::<()>(redis::cmd("DEL").arg(&key)).await?,
        }
    }
    Ok(())
}
