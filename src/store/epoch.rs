//! The hot store's epoch marker and rebuild lease.
//!
//! How instances notice that the hot store lost its data (restart without persistence,
//! failover to an empty replica, `FLUSHALL`) and agree on one of them rebuilding it
//! (`crate::recovery`).

use super::{Error, Hot, Keys};

/// The epoch marker: None when the hot store holds none (lost, or never written).
pub async fn get(hot: &Hot, keys: &Keys, now_ms: i64) -> Result<Option<String>, Error> {
    hot.get(&keys.epoch(), now_ms).await
}

/// Writes the epoch marker (no expiry).
pub async fn set(hot: &Hot, keys: &Keys, epoch: &str, now_ms: i64) -> Result<(), Error> {
    let key = keys.epoch();
    match hot {
        Hot::Memory(memory) => {
            memory.value_update(&key, now_ms, |_| {
                (Some((epoch.to_owned(), i64::MAX / 4)), ())
            });
            Ok(())
        }
        Hot::Redis(redis) => redis.query(redis::cmd("SET").arg(&key).arg(epoch)).await,
    }
}

/// Takes the rebuild lease for `ttl_ms` unless another instance holds it: true if taken.
pub async fn claim(
    hot: &Hot,
    keys: &Keys,
    owner: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, Error> {
    hot.set_nx(&keys.rebuild_lease(), owner, now_ms, ttl_ms)
        .await
}

/// Deletes the lease if it still names its owner (`ARGV[1]`).
static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// Gives the rebuild lease back if `owner` still holds it.
pub async fn release(hot: &Hot, keys: &Keys, owner: &str, now_ms: i64) -> Result<(), Error> {
    let key = keys.rebuild_lease();
    match hot {
        Hot::Memory(memory) => {
            if memory.value_update(&key, now_ms, |held| (None, held == Some(owner))) {
                memory.value_delete(&key);
            }
            Ok(())
        }
        Hot::Redis(redis) => {
            redis
                .eval::<i64>(&RELEASE, &[key], &[owner.to_owned()])
                .await?;
            Ok(())
        }
    }
}
