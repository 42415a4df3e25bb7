//! Changing policy without fear: record, suggest, check, replay, canary, promote.
//!
//! The traffic record ([`record`]), budgets suggested from it ([`suggest`]), the static
//! check of a candidate file ([`check`]), the replay of recorded traffic through the live
//! and a candidate policy ([`replay`], [`logins`]), and the candidate run beside the live
//! policy and promoted ([`canary`]).
//!
//! The replay runs the real limiter (the in-process twin of the Redis script) on simulated
//! time with the multipliers the live limiter applied to each recorded check, so a
//! candidate's answers are the ones it would have given that traffic.

pub mod canary;
pub mod check;
pub mod logins;
mod promotion;
pub mod record;
pub mod replay;
pub mod suggest;
