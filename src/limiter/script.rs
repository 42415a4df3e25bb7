//! `lua/token_bucket.lua`'s side of the call: the keys and arguments of a request, written
//! into its command, and its reply read back ([`super::calls`]).

use super::{RawOutcome, Scope};
use crate::store::Error;

const VALUES_PER_SCOPE: usize = 7;
/// Bytes per value of the script's reply (little-endian i64).
const VALUE_BYTES: usize = 8;

/// Most checks in one call.
pub(super) const MAX_BATCH: usize = 64;

/// What the script does with a request's scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Answers without consuming.
    Check,
    /// Consumes if every enforced scope allows.
    Consume,
    /// Gives back what a `Consume` took (a cluster check refused in another slot).
    Refund,
}

impl Mode {
    pub(super) fn of(consume: bool) -> Self {
        if consume { Mode::Consume } else { Mode::Check }
    }
}

/// One request's keys: per scope its bucket and multiplier key.
pub(super) fn write_keys<'a>(out: &mut redis::Cmd, scopes: impl IntoIterator<Item = &'a Scope>) {
    for scope in scopes {
        out.arg(&*scope.bucket_key);
        out.arg(&*scope.multiplier_key);
    }
}

/// One request's arguments (after the call's leading request count): cost, mode, number
/// of scopes, then per scope capacity, refill per second, enforce (with `:share` for a
/// budget held across regions), default multiplier (or `=m`: the multiplier to use whatever
/// is published).
pub(super) fn write_args<'a, I>(out: &mut redis::Cmd, scopes: I, cost: u32, mode: Mode)
where
    I: IntoIterator<Item = &'a Scope>,
    I::IntoIter: ExactSizeIterator,
{
    let scopes = scopes.into_iter();
    out.arg(cost);
    out.arg(match mode {
        Mode::Check => 0,
        Mode::Consume => 1,
        Mode::Refund => 2,
    });
    out.arg(scopes.len() as i64);
    for scope in scopes {
        number_arg(out, scope.params.capacity);
        number_arg(out, scope.params.refill_per_s);
        match scope.share {
            // `1:0.25`: enforced, spent at a quarter of a budget held across regions.
            Some(share) => {
                out.arg(format!("{}:{share}", i64::from(scope.enforced)));
            }
            None => {
                out.arg(i64::from(scope.enforced));
            }
        }
        match scope.multiplier_override {
            Some(value) => {
                out.arg(format!("={value}"));
            }
            None => number_arg(out, scope.default_multiplier),
        }
    }
}

/// A number for the script (its `tonumber` reads `10` as it reads `10.0`): a whole one, as
/// capacities, refill rates and multipliers nearly always are, written as an integer
/// (formatting a float cost a check about as much as the rest of its arguments together).
fn number_arg(out: &mut redis::Cmd, value: f64) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole number below is exact.
    if value.fract() == 0.0 && value.abs() < EXACT {
        out.arg(value as i64);
    } else {
        out.arg(value.to_string());
    }
}

/// The length of one request's part of the script's reply.
pub(super) fn reply_len(scopes: usize) -> usize {
    (1 + scopes * VALUES_PER_SCOPE) * VALUE_BYTES
}

fn bad_reply(message: String) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected token_bucket.lua reply",
        message,
    )))
}

fn non_negative(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// One request's part of the script's reply: `1 + 7 × scopes` little-endian i64 values.
pub(super) fn parse(reply: &[u8], scopes: usize) -> Result<(bool, Vec<RawOutcome>), Error> {
    if reply.len() != reply_len(scopes) {
        return Err(bad_reply(format!(
            "{} bytes for {scopes} scopes",
            reply.len()
        )));
    }
    let values: Vec<i64> = reply
        .chunks_exact(VALUE_BYTES)
        .map(|v| i64::from_le_bytes(v.try_into().expect("chunks of 8 bytes")))
        .collect();
    let admitted = values[0] == 1;
    let outcomes = values[1..]
        .chunks_exact(VALUES_PER_SCOPE)
        .map(|v| RawOutcome {
            allowed: v[0] == 1,
            limit: non_negative(v[1]),
            remaining: non_negative(v[2]),
            reset_ms: non_negative(v[3]),
            retry_after_ms: (v[4] >= 0).then(|| non_negative(v[4])),
            multiplier: v[5] as f64 / 1e6,
            multiplier_ttl_ms: (v[6] > 0).then(|| non_negative(v[6])),
        })
        .collect();
    Ok((admitted, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(value: f64) -> String {
        let mut cmd = redis::cmd("EVALSHA");
        number_arg(&mut cmd, value);
        match cmd.args_iter().nth(1) {
            Some(redis::Arg::Simple(bytes)) => String::from_utf8(bytes.to_vec()).unwrap(),
            other => panic!("unexpected argument {other:?}"),
        }
    }

    #[test]
    fn numbers_reach_the_script_as_lua_reads_them() {
        // Whole numbers as integers, the rest as floats; Lua's `tonumber` gives the same
        // value for either spelling, and for what a float argument was before.
        for (value, text) in [
            (10.0, "10"),
            (1.0, "1"),
            (0.0, "0"),
            (100_000.0, "100000"),
            (0.5, "0.5"),
            (1.0 / 60.0, "0.016666666666666666"),
            (-2.5, "-2.5"),
            // Past 2^53 a float, in Rust's shortest exact decimal (Lua reads it back).
            (1e300, &*format!("1{}", "0".repeat(300))),
        ] {
            let got = written(value);
            assert_eq!(got, text, "{value}");
            assert_eq!(got.parse::<f64>().unwrap(), value, "{value}");
        }
    }
}
