//! The bucket reference model: pure GCRA maths shared by the in-process backend, the tests
//! and (line by line) `lua/token_bucket.lua`.
//!
//! A token bucket with capacity `C` and refill `R` per second is stored as one number, the
//! *theoretical arrival time* `tat` (µs): the bucket is full at `tat`. With a multiplier `m`,
//! `C' = C·m` and `R' = R·m`; the burst window `W = C/R` does not depend on `m`, so a
//! multiplier change keeps the bucket's fraction, and 0 blocks.

/// Slack for floating-point comparisons, in µs (far below the 1 ms resolution of answers).
const EPSILON_US: f64 = 1e-3;

/// One bucket's parameters for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Capacity before the multiplier, in cost units.
    pub capacity: f64,
    /// Refill before the multiplier, cost units per second.
    pub refill_per_s: f64,
    /// The subject's multiplier (0 blocks; > 1 allows more).
    pub multiplier: f64,
}

/// One bucket's verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// The bucket holds `cost` tokens.
    pub allowed: bool,
    /// Effective capacity `C·m`.
    pub limit: f64,
    /// Whole tokens left (after consuming, if allowed).
    pub remaining: u64,
    /// µs until the bucket is full again (after consuming, if allowed).
    pub reset_us: f64,
    /// µs until the bucket holds `cost` tokens; 0 when allowed; infinite when it never will
    /// under the current multiplier (0, or `cost` above the effective capacity).
    pub retry_after_us: f64,
    /// The state to store if the request is admitted.
    pub new_tat: f64,
}

/// Evaluates a request of `cost` against a bucket last stored as `tat` (None: full) at `now`.
pub fn evaluate(tat: Option<f64>, now_us: f64, params: Params, cost: f64) -> Verdict {
    evaluate_owed(owed(tat, now_us, params), now_us, params, cost)
}

/// [`evaluate`] for a budget held across regions, at `share` of it, of a bucket written at
/// share `written`: it owes the same tokens at the new share.
///
/// `params` are scaled by `share` (`crate::regions`); the time owed is scaled by
/// `written / share`, beyond the window if the share fell. A share that rises brings its
/// new tokens whole and one that falls still owes what was spent, so the regions' buckets
/// together hold what one bucket would, whatever the shares do: a burst in one region
/// spends what the quiet regions gave up. Keeping the fraction instead (the time alone, as
/// a multiplier does) would hand the tokens a falling share gives up to no one.
pub fn evaluate_shared(
    tat: Option<f64>,
    written: f64,
    now_us: f64,
    params: Params,
    share: f64,
    cost: f64,
) -> Verdict {
    let mut owed_us = owed(tat, now_us, params);
    if written != share && share > 0.0 {
        owed_us *= written / share;
    }
    evaluate_owed(owed_us, now_us, params, cost)
}

/// µs until a bucket stored as `tat` is full; a clock step backwards can never make the
/// bucket more than empty.
fn owed(tat: Option<f64>, now_us: f64, params: Params) -> f64 {
    let window_us = params.capacity / params.refill_per_s * 1e6;
    tat.map_or(0.0, |tat| (tat - now_us).clamp(0.0, window_us))
}

fn evaluate_owed(deficit: f64, now_us: f64, params: Params, cost: f64) -> Verdict {
    let limit = params.capacity * params.multiplier;
    let rate_per_us = params.refill_per_s * params.multiplier / 1e6;
    let window_us = params.capacity / params.refill_per_s * 1e6;
    if rate_per_us <= 0.0 || cost > limit + 1e-9 {
        return Verdict {
            allowed: false,
            limit: limit.max(0.0),
            remaining: tokens(window_us - deficit, rate_per_us),
            reset_us: deficit,
            retry_after_us: f64::INFINITY,
            new_tat: now_us + deficit,
        };
    }
    let needed = deficit + cost / rate_per_us;
    if needed <= window_us + EPSILON_US {
        Verdict {
            allowed: true,
            limit,
            remaining: tokens(window_us - needed, rate_per_us),
            reset_us: needed,
            retry_after_us: 0.0,
            new_tat: now_us + needed,
        }
    } else {
        Verdict {
            allowed: false,
            limit,
            remaining: tokens(window_us - deficit, rate_per_us),
            reset_us: deficit,
            retry_after_us: needed - window_us,
            new_tat: now_us + deficit,
        }
    }
}

fn tokens(spare_us: f64, rate_per_us: f64) -> u64 {
    // Non-negative, so the (saturating) conversion's truncation is the floor; no libm call.
    (spare_us.max(0.0) * rate_per_us + 1e-9) as u64
}

/// Whole milliseconds, rounded up (a client that waits this long will be admitted).
pub fn ceil_ms(us: f64) -> u64 {
    if us.is_finite() {
        (us / 1000.0 - 1e-9).ceil().max(0.0) as u64
    } else {
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(capacity: f64, refill_per_s: f64, multiplier: f64) -> Params {
        Params {
            capacity,
            refill_per_s,
            multiplier,
        }
    }

    /// Runs a request against a stored state, storing the result if admitted.
    fn step(state: &mut Option<f64>, now_us: f64, p: Params, cost: f64) -> Verdict {
        let verdict = evaluate(*state, now_us, p, cost);
        if verdict.allowed {
            *state = Some(verdict.new_tat);
        }
        verdict
    }

    #[test]
    fn a_full_bucket_admits_exactly_its_capacity() {
        let p = params(5.0, 5.0 / 60.0, 1.0);
        let mut state = None;
        for expected_remaining in (0..5).rev() {
            let verdict = step(&mut state, 0.0, p, 1.0);
            assert!(verdict.allowed);
            assert_eq!(verdict.remaining, expected_remaining);
        }
        let denied = step(&mut state, 0.0, p, 1.0);
        assert!(!denied.allowed);
        assert_eq!(ceil_ms(denied.retry_after_us), 12_000);
    }

    #[test]
    fn a_share_that_changes_keeps_the_tokens_owed() {
        // A budget of 10 tokens refilling 1/s, spent at half: 4 of its 5 taken at once.
        let at = |share: f64| params(10.0 * share, share, 1.0);
        let mut state = None;
        for _ in 0..4 {
            let verdict = evaluate_shared(state, 0.5, 0.0, at(0.5), 0.5, 1.0);
            assert!(verdict.allowed);
            state = Some(verdict.new_tat);
        }
        // Risen to the whole budget: 4 owed of 10, so 5 left after one more (keeping the
        // fraction, 1).
        let risen = evaluate_shared(state, 0.5, 0.0, at(1.0), 1.0, 1.0);
        assert_eq!(risen.remaining, 5);
        // Fallen to a fifth (2 tokens) while owing 4: the next token comes when 3 are
        // repaid at 0.2/s, in 15 s (a bucket that forgot what it owes past its window would
        // admit it in 5 s, and a share swinging back and forth would mint tokens).
        let refused = evaluate_shared(state, 0.5, 0.0, at(0.2), 0.2, 1.0);
        assert!(!refused.allowed);
        assert_eq!(ceil_ms(refused.retry_after_us), 15_000);
        assert_eq!(refused.remaining, 0);
        // At the share it was written at, the plain evaluation.
        assert_eq!(
            evaluate_shared(state, 0.5, 1e6, at(0.5), 0.5, 1.0),
            evaluate(state, 1e6, at(0.5), 1.0)
        );
    }

    #[test]
    fn fractional_tokens_are_floored_not_truncated_into_errors() {
        // Field-guide defect: capacity 5 at multiplier 0.5 holds 2.5 tokens; the answer must
        // say 2 remaining after none consumed, admit 2, and deny the third.
        let p = params(5.0, 5.0 / 60.0, 0.5);
        let first = evaluate(None, 0.0, p, 1.0);
        assert_eq!(first.remaining, 1);
        let mut state = None;
        assert!(step(&mut state, 0.0, p, 1.0).allowed);
        assert!(step(&mut state, 0.0, p, 1.0).allowed);
        let third = step(&mut state, 0.0, p, 1.0);
        assert!(!third.allowed);
        assert_eq!(third.remaining, 0);
        // Half a token is there; the other half takes 0.5 / (5/60·0.5) s = 12 s.
        assert_eq!(ceil_ms(third.retry_after_us), 12_000);
    }

    #[test]
    fn multiplier_zero_blocks_and_never_promises_a_retry() {
        let verdict = evaluate(None, 0.0, params(10.0, 1.0, 0.0), 1.0);
        assert!(!verdict.allowed);
        assert_eq!(verdict.limit, 0.0);
        assert!(verdict.retry_after_us.is_infinite());
    }

    #[test]
    fn a_clock_step_backwards_does_not_burn_more_than_the_bucket() {
        let p = params(10.0, 1.0, 1.0);
        let mut state = None;
        assert!(step(&mut state, 100e6, p, 1.0).allowed);
        // The clock jumps back an hour: the bucket reads as empty at worst, and refills
        // from there instead of owing an hour of tokens.
        let back = evaluate(state, 100e6 - 3600e6, p, 1.0);
        assert!(!back.allowed);
        assert!(back.retry_after_us <= 1e6 + 1.0, "{back:?}");
    }

    #[test]
    fn multiplier_two_doubles_capacity() {
        let p = params(3.0, 1.0, 2.0);
        let mut state = None;
        let admitted = (0..10)
            .filter(|_| step(&mut state, 0.0, p, 1.0).allowed)
            .count();
        assert_eq!(admitted, 6);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Advance(u64),
        Request(u32),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                (0u64..5_000_000).prop_map(Op::Advance),
                (1u32..5).prop_map(Op::Request),
            ],
            1..200,
        )
    }

    proptest! {
        /// Admitted cost in any interval [t, t+d] ≤ C·m + R·m·d.
        #[test]
        fn admitted_cost_never_exceeds_capacity_plus_refill(
            ops in ops(),
            capacity in 1u32..50,
            period_s in 1u32..120,
            multiplier in prop_oneof![Just(1.0), Just(0.5), Just(2.0), 0.1f64..3.0],
        ) {
            let p = params(f64::from(capacity), f64::from(capacity) / f64::from(period_s), multiplier);
            let mut state = None;
            let mut now = 0u64;
            let mut admitted: Vec<(u64, u32)> = Vec::new();
            for op in ops {
                match op {
                    Op::Advance(us) => now += us,
                    Op::Request(cost) => {
                        if step(&mut state, now as f64, p, f64::from(cost)).allowed {
                            admitted.push((now, cost));
                        }
                    }
                }
            }
            let limit = p.capacity * p.multiplier;
            let rate = p.refill_per_s * p.multiplier;
            for (i, (start, _)) in admitted.iter().enumerate() {
                let mut total = 0.0;
                for (at, cost) in &admitted[i..] {
                    total += f64::from(*cost);
                    let d = (*at - *start) as f64 / 1e6;
                    prop_assert!(total <= limit + rate * d + 1e-6,
                        "admitted {total} in {d}s; bound {}", limit + rate * d);
                }
            }
        }

        /// `retry_after_ms` is exact to the millisecond: one ms earlier is still denied,
        /// at the promised time the request is admitted.
        #[test]
        fn retry_after_is_exact_to_the_millisecond(
            capacity in 1u32..30,
            period_s in 1u32..100,
            burst in 1u32..40,
            cost in 1u32..5,
            multiplier in prop_oneof![Just(1.0), 0.2f64..2.5],
        ) {
            let p = params(f64::from(capacity), f64::from(capacity) / f64::from(period_s), multiplier);
            prop_assume!(f64::from(cost) <= p.capacity * p.multiplier);
            let mut state = None;
            let mut now = 0.0;
            let mut denial = None;
            for _ in 0..burst + 100 {
                let verdict = step(&mut state, now, p, f64::from(cost));
                if !verdict.allowed {
                    denial = Some(verdict);
                    break;
                }
                now += 1000.0;
            }
            let denial = denial.expect("a finite bucket denies eventually");
            let wait_ms = ceil_ms(denial.retry_after_us);
            prop_assert!(wait_ms >= 1);
            let early = evaluate(state, now + (wait_ms - 1) as f64 * 1000.0, p, f64::from(cost));
            prop_assert!(!early.allowed, "admitted 1 ms before the promised time");
            let on_time = evaluate(state, now + wait_ms as f64 * 1000.0, p, f64::from(cost));
            prop_assert!(on_time.allowed, "denied at the promised time");
        }
    }
}
