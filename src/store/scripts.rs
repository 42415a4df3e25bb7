//! Lua scripts, loaded once and run with EVALSHA (redis-rs `Script` reloads on NOSCRIPT).

use std::sync::LazyLock;

/// `lua/token_bucket.lua`: check and consume every scope of one request.
pub static TOKEN_BUCKET: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(TOKEN_BUCKET_SOURCE));

/// The body of [`TOKEN_BUCKET`].
pub const TOKEN_BUCKET_SOURCE: &str = include_str!("../../lua/token_bucket.lua");

/// `lua/velocity_batch.lua`: window operations on packed window values, in order.
pub static VELOCITY_BATCH: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/velocity_batch.lua")));

/// `lua/window_cas.lua`: write window values computed by the service if unchanged.
pub static WINDOW_CAS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/window_cas.lua")));

/// `lua/factors_update.lua`: change a subject's stored factors and read them back.
pub static FACTORS_UPDATE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/factors_update.lua")));

/// `lua/multiplier_publish.lua`: write a subject's multipliers unless superseded.
pub static MULTIPLIER_PUBLISH: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/multiplier_publish.lua")));

/// `lua/challenge_consume.lua`: use an attestation challenge once.
pub static CHALLENGE_CONSUME: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/challenge_consume.lua")));

/// `lua/lock_marker.lua`: mark an account's lock marker stored, or delete it, only while
/// it names the given lockout.
pub static LOCK_MARKER: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/lock_marker.lua")));
