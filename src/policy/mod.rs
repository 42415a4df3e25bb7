//! Changing policy without fear: record, replay, check.
//!
//! The traffic record ([`record`]), the replay of recorded traffic through the live and a
//! candidate policy ([`replay`]), and the static check of a candidate file ([`check`]).
//!
//! The replay runs the real limiter (the in-process twin of the Redis script) on simulated
//! time, so a candidate's answers are the ones it would give; multipliers are held at 1
//! (the record keeps the requests, not the signals of the day).

pub mod canary;
pub mod check;
pub mod export;
pub mod logins;
pub mod overrides;
pub mod record;
pub mod replay;
pub mod suggest;
