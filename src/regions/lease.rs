//! Leased shares of a global budget: what a region may spend of one key's budget.
//!
//! Shares follow the demand every region reported. Pure (no I/O): the service
//! ([`super::shares`]) and the simulator (`cargo bench --bench regions`) run the same code.
//!
//! A region spends its share `s` of a key's budget as a bucket of `s` × capacity refilling
//! at `s` × the rate (a multiplier: the bucket's window is unchanged, so a share that shrinks
//! takes away what was not yet spent and never hands back what was). Shares add up to 1
//! over the regions that hold a lease, so what all regions admit together stays within the
//! budget, but for:
//! - a region that meets a key it holds no lease for spends `1/count` of it until its next
//!   renewal (a fair slice, so a key used in one region alone is admitted at once);
//! - a region cut off from the others keeps its last lease; the others count its last
//!   demand until the lease ends ([`Lease::lease_ms`]), then take its share over.

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
}

impl Lease {
    /// The leases of `regions` regions renewing every `renew_ms`: a report counts for eight
    /// renewals (2 s at 250 ms), long enough for a late renewal or two.
    pub fn new(regions: u32, renew_ms: u64) -> Self {
        Self {
            regions: regions.max(1),
            lease_ms: i64::try_from(renew_ms.saturating_mul(8)).unwrap_or(i64::MAX),
        }
    }

    /// The share of a key before this region holds a lease for it.
    pub fn unleased(&self) -> f64 {
        1.0 / f64::from(self.regions)
    }

    /// `region`'s share of a key from every region's latest report (`reports`, its own
    /// included), at `now_ms`: its demand over the demand of every region whose report
    /// still counts; [`Lease::unleased`] when no region reported any.
    pub fn share(&self, region: &str, reports: &[Report<'_>], now_ms: i64) -> f64 {
        let live = |r: &&Report<'_>| now_ms.saturating_sub(r.at_ms) <= self.lease_ms;
        let total: f64 = reports.iter().filter(live).map(|r| r.demand.max(0.0)).sum();
        if total <= 0.0 {
            return self.unleased();
        }
        let own: f64 = reports
            .iter()
            .filter(live)
            .filter(|r| r.region == region)
            .map(|r| r.demand.max(0.0))
            .sum();
        (own / total).clamp(0.0, 1.0)
    }
}

/// The share to spend after a renewal: halfway from the share spent before to the new
/// `target` ([`Lease::share`]), or the target for a key leased the first time.
///
/// Regions renew at different moments, so their demands move out of step; a share that
/// jumped to each new target would swing, and a region whose share swings up spends at the
/// new share what it owed at the old one (a bucket's debt is time, scaled by its share).
/// Halving each move damps the swing.
pub fn step(previous: Option<f64>, target: f64) -> f64 {
    match previous {
        Some(previous) => 0.5 * previous + 0.5 * target,
        None => target,
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

    #[test]
    fn shares_follow_demand_and_add_up_to_one() {
        let lease = Lease::new(3, 250);
        let reports = [
            report("eu", 70.0, 1000),
            report("us", 20.0, 1000),
            report("ap", 10.0, 900),
        ];
        let shares: Vec<f64> = ["eu", "us", "ap"]
            .iter()
            .map(|r| lease.share(r, &reports, 1100))
            .collect();
        assert_eq!(shares, [0.7, 0.2, 0.1]);
        assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_key_no_region_reported_gets_a_fair_slice() {
        let lease = Lease::new(4, 250);
        assert_eq!(lease.share("eu", &[], 0), 0.25);
        assert_eq!(lease.share("eu", &[report("us", 0.0, 0)], 0), 0.25);
    }

    #[test]
    fn a_silent_region_holds_its_lease_until_it_ends() {
        let lease = Lease::new(2, 250);
        let reports = [report("eu", 50.0, 0), report("us", 50.0, 10_000)];
        assert_eq!(lease.share("us", &reports, 2_000), 0.5, "eu's lease holds");
        assert_eq!(lease.share("us", &reports, 10_000), 1.0, "eu's lease ended");
        assert_eq!(lease.share("eu", &reports, 10_000), 0.0);
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
        assert_eq!(lease.share("eu", &reports, 0), 0.6);
    }

    #[test]
    fn a_share_moves_halfway_to_its_target() {
        assert_eq!(step(None, 0.8), 0.8);
        assert_eq!(step(Some(0.2), 0.8), 0.5);
    }

    #[test]
    fn demand_rises_at_once_and_falls_by_half() {
        assert_eq!(smooth(None, 8.0), 8.0);
        assert_eq!(smooth(Some(8.0), 0.0), 4.0);
        assert_eq!(smooth(Some(4.0), 12.0), 12.0);
    }
}
