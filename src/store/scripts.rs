//! Lua scripts, loaded once and run with EVALSHA (redis-rs `Script` reloads on NOSCRIPT).

use std::sync::LazyLock;

/// `lua/token_bucket.lua`: check and consume every scope of one request.
pub static TOKEN_BUCKET: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/token_bucket.lua")));

/// `lua/velocity_window.lua`: record failures in sliding windows and count them.
pub static VELOCITY_WINDOW: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/velocity_window.lua")));
