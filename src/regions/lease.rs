//! Leased shares of a global budget: what a region may spend of one key's budget.
//!
//! Shares follow the demand every region reported. Pure (no I/O): the service
//! ([`super::shares`]) and the simulator (`cargo bench --bench regions`) run the same code.
//!
//! A region spends its share `s` of a key's budget as a bucket of `s` × capacity refilling
//! at `s` × the rate (the bucket's window is unchanged); when `s` moves, the bucket keeps
//! the tokens it owes ([`crate::limiter::bucket::evaluate_shared`]), so a share that rises
//! brings its new tokens and one that falls still owes what was spent. Shares add up to 1
//! over the regions that hold a lease, so what all regions admit together stays within the
//! budget, but for:
//! - a region that meets a key it holds no lease for spends `1/count` of it until its next
//!   renewal (a fair slice, so a key used in one region alone is admitted at once);
//! - a region cut off from the others keeps its last lease; the others count its last
//!   demand until the lease ends ([`Lease::lease_ms`], or [`Lease::open_lease_ms`] for a
//!   class that fails open, whose cut-off region goes on spending), then take its share
//!   over.

/// One region's latest report for a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report<'a> {
    /// The region reporting.
    pub region: &'a str,
    /// Its demand: cost per renewal period, smoothed ([`smooth`]).
    pub demand: f64,
    /// When it was written (the database's clock as the writer saw it), Unix ms.
    pub at_ms: i64,
}

/// How shares are leased.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lease {
    /// Regions sharing the budgets (`regions.count`).
    pub regions: u32,
    /// How long a report counts after it was written: a region silent for longer (cut off,
    /// or no longer asked for the key) holds no lease.
    pub lease_ms: i64,
    /// The same for a class that fails open: a region cut off goes on spending its last
    /// share, so the others hold it for it this long (240 renewals: a minute at 250 ms).
    pub open_lease_ms: i64,
}

impl Lease {
    /// The leases of `regions` regions renewing every `renew_ms`: a report counts for eight
    /// renewals (2 s at 250 ms), long enough for a late renewal or two.
    pub fn new(regions: u32, renew_ms: u64) -> Self {
        Self {
            regions: regions.max(1),
            lease_ms: i64::try_from(renew_ms.saturating_mul(8)).unwrap_or(i64::MAX),
            open_lease_ms: i64::try_from(renew_ms.saturating_mul(240)).unwrap_or(i64::MAX),
        }
    }

    /// The share of a key before this region holds a lease for it.
    pub fn unleased(&self) -> f64 {
        1.0 / f64::from(self.regions)
    }

    /// `region`'s share of a key from every region's latest report (`reports`, its own
    /// included), at `now_ms`, for a budget that refills `budget` (cost per renewal period,
    /// the unit of demand). Regions whose report still counts divide the budget:
    /// - demand within the budget: each gets its demand and an equal part of what is left
    ///   (so every region has room for a burst);
    /// - demand over it: in proportion to demand, as one bucket over every region would
    ///   admit them. Not max-min fair: a region given exactly its mean demand would
    ///   refuse its own variance.
    ///
    /// [`Lease::unleased`] when no region reported any demand. A report counts for a lease
    /// ([`Lease::lease_ms`]); for a class that fails open (`fails_open`) for
    /// [`Lease::open_lease_ms`], since a region cut off from the database goes on spending
    /// its last share and the others must not take it over meanwhile.
    pub fn share(
        &self,
        region: &str,
        reports: &[Report<'_>],
        now_ms: i64,
        budget: f64,
        fails_open: bool,
    ) -> f64 {
        let lease_ms = if fails_open {
            self.open_lease_ms
        } else {
            self.lease_ms
        };
        // Demand per region (each instance reports its own).
        let mut demands: Vec<(&str, f64)> = Vec::with_capacity(4);
        for report in reports
            .iter()
            .filter(|r| now_ms.saturating_sub(r.at_ms) <= lease_ms)
        {
            let demand = report.demand.max(0.0);
            match demands.iter_mut().find(|(r, _)| *r == report.region) {
                Some((_, d)) => *d += demand,
                None => demands.push((report.region, demand)),
            }
        }
        let total: f64 = demands.iter().map(|(_, d)| d).sum();
        let Some(&(_, own)) = demands.iter().find(|(r, _)| *r == region) else {
            return if total > 0.0 { 0.0 } else { self.unleased() };
        };
        if total <= 0.0 {
            return self.unleased();
        }
        let budget = if budget.is_finite() && budget > 0.0 {
            budget
        } else {
            // No rate to weigh demand against: shares in proportion to demand.
            return (own / total).clamp(0.0, 1.0);
        };
        let live = demands.len() as f64;
        let allotted = if total <= budget {
            own + (budget - total) / live
        } else {
            own * budget / total
        };
        (allotted / budget).clamp(0.0, 1.0)
    }
}

/// The share to spend after a renewal, moved from the one spent before towards `target`.
///
/// Three quarters of the way up to a higher target ([`Lease::share`]), halfway down to a
/// lower one. A key leased the first time gets its target, but at most `fair` (the fair
/// slice, [`Lease::unleased`]): the other regions using the key may not have reported yet,
/// and a region that took the whole budget before they do would spend what they spent
/// (a key used in one region alone gets its whole budget at the second renewal).
///
/// Regions renew at different moments and see each other's demands at different ages, so
/// for a renewal their shares can add up to more than one: a share that rises brings its
/// new tokens at once ([`crate::limiter::bucket::evaluate_shared`]), while the ones falling
/// still owe theirs. Damping each move bounds that swing; a rise moves further than a fall
/// so that demand moving to a region is followed within a renewal or two
/// (`cargo bench --bench regions` weighs the two).
pub fn step(previous: Option<f64>, target: f64, fair: f64) -> f64 {
    match previous {
        Some(previous) if target > previous => 0.25 * previous + 0.75 * target,
        Some(previous) => 0.5 * previous + 0.5 * target,
        None => target.min(fair),
    }
}

/// The demand to report: a rise at once (a region whose demand jumps gets its share at the
/// next renewal), a fall by half per period (one quiet period does not give a busy
/// region's share away).
pub fn smooth(previous: Option<f64>, period: f64) -> f64 {
    match previous {
        Some(previous) if previous > period => 0.5 * previous + 0.5 * period,
        _ => period,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(region: &str, demand: f64, at_ms: i64) -> Report<'_> {
        Report {
            region,
            demand,
            at_ms,
        }
    }

    fn shares(lease: &Lease, reports: &[Report<'_>], budget: f64) -> Vec<f64> {
        ["eu", "us", "ap"]
            .iter()
            .map(|r| lease.share(r, reports, 1100, budget, false))
            .collect()
    }

    fn close(got: &[f64], want: &[f64]) -> bool {
        got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-9)
    }

    #[test]
    fn demand_within_the_budget_gets_what_it_asks_and_an_equal_part_of_the_rest() {
        let lease = Lease::new(3, 250);
        let reports = [
            report("eu", 30.0, 1000),
            report("us", 20.0, 1000),
            report("ap", 10.0, 900),
        ];
        let got = shares(&lease, &reports, 90.0);
        assert!(
            close(&got, &[40.0 / 90.0, 30.0 / 90.0, 20.0 / 90.0]),
            "{got:?}"
        );
        // Exactly the budget: shares in proportion to demand.
        let got = shares(&lease, &reports, 60.0);
        assert!(close(&got, &[0.5, 1.0 / 3.0, 1.0 / 6.0]), "{got:?}");
    }

    #[test]
    fn demand_over_the_budget_is_divided_in_proportion() {
        let lease = Lease::new(3, 250);
        let reports = [
            report("eu", 140.0, 1000),
            report("us", 40.0, 1000),
            report("ap", 20.0, 900),
        ];
        let got = shares(&lease, &reports, 100.0);
        assert!(close(&got, &[0.7, 0.2, 0.1]), "{got:?}");
    }

    #[test]
    fn shares_add_up_to_one_whatever_the_demand() {
        let lease = Lease::new(3, 250);
        for (eu, us, ap, budget) in [
            (1.0, 2.0, 3.0, 100.0),
            (500.0, 1.0, 0.0, 100.0),
            (33.0, 33.0, 34.0, 100.0),
            (7.0, 0.5, 90.0, 10.0),
            (7.0, 0.5, 90.0, f64::NAN),
        ] {
            let reports = [
                report("eu", eu, 1000),
                report("us", us, 1000),
                report("ap", ap, 1000),
            ];
            let sum: f64 = shares(&lease, &reports, budget).iter().sum();
            assert!((sum - 1.0).abs() < 1e-9, "{eu} {us} {ap} {budget}: {sum}");
        }
    }

    #[test]
    fn a_key_no_region_reported_gets_a_fair_slice() {
        let lease = Lease::new(4, 250);
        assert_eq!(lease.share("eu", &[], 0, 10.0, false), 0.25);
        assert_eq!(
            lease.share("eu", &[report("us", 0.0, 0)], 0, 10.0, false),
            0.25
        );
    }

    #[test]
    fn a_silent_region_holds_its_lease_until_it_ends() {
        let lease = Lease::new(2, 250);
        let reports = [report("eu", 50.0, 0), report("us", 50.0, 10_000)];
        let share = |region, now, fails_open| lease.share(region, &reports, now, 100.0, fails_open);
        assert_eq!(share("us", 2_000, false), 0.5, "eu's lease holds");
        assert_eq!(share("us", 10_000, false), 1.0, "eu's lease ended");
        assert_eq!(share("eu", 10_000, false), 0.0);
        // Failing open, a region cut off goes on spending its share: it is held longer.
        assert_eq!(
            share("us", 10_000, true),
            0.5,
            "held for a class that fails open"
        );
        assert_eq!(share("us", 70_000, true), 1.0, "until the open lease ends");
    }

    #[test]
    fn several_reports_of_one_region_add_up() {
        // Each instance of a region reports its own demand.
        let lease = Lease::new(2, 250);
        let reports = [
            report("eu", 30.0, 0),
            report("eu", 30.0, 0),
            report("us", 40.0, 0),
        ];
        assert_eq!(lease.share("eu", &reports, 0, 100.0, false), 0.6);
    }

    #[test]
    fn a_share_rises_three_quarters_and_falls_half_way_to_its_target() {
        assert_eq!(step(Some(0.25), 0.75, 0.5), 0.625);
        assert_eq!(step(Some(0.75), 0.25, 0.5), 0.5);
    }

    #[test]
    fn a_first_lease_is_at_most_the_fair_slice() {
        assert_eq!(step(None, 0.8, 0.5), 0.5);
        assert_eq!(step(None, 0.2, 0.5), 0.2);
    }

    #[test]
    fn demand_rises_at_once_and_falls_by_half() {
        assert_eq!(smooth(None, 8.0), 8.0);
        assert_eq!(smooth(Some(8.0), 0.0), 4.0);
        assert_eq!(smooth(Some(4.0), 12.0), 12.0);
    }
}
