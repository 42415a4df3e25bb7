//! This instance's leased shares of the global budgets (`regions.global_budgets`).
//!
//! Every check that meets a global budget counts its cost as demand for the key and spends
//! the region's current share of it ([`Shares::share`]). Every `regions.renew_ms` the
//! instance reports its smoothed demand for the keys it used and reads every region's
//! reports for them, one round trip to Postgres ([`Shares::renew`]), and sizes each share
//! with [`super::lease`]. Report times and liveness use the database's clock, the one clock
//! every region shares (as token buckets use Redis `TIME`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::PgPool;

use crate::clock::Clock;

use super::lease::{Lease, Report, smooth, step};
use crate::telemetry::metrics as names;

/// The smallest share spent: a bucket scaled to nothing has no window, so a region with no
/// lease on a key keeps a thousandth of it.
pub const MIN_SHARE: f64 = 0.001;

/// A demand below this (after smoothing) and no use in the last period: the key is dropped
/// (its next use starts unleased).
const IDLE: f64 = 0.01;

#[derive(Debug, Default)]
struct Entry {
    /// The share leased at the last renewal; None before the first.
    share: Option<f64>,
    /// Cost checked since the last renewal.
    period: f64,
    /// What was reported last (smoothed).
    reported: Option<f64>,
    /// The budget's refill per renewal period (demand is weighed against it), as last spent.
    budget: f64,
    /// Whether the class last spending it fails closed (how long a silent region's share
    /// is held for it: [`Lease::share`]).
    fails_closed: bool,
}

/// Leased shares of the global budgets, per key.
#[derive(Debug)]
pub struct Shares {
    pool: PgPool,
    region: String,
    /// This instance: its region and a unique suffix (each instance reports its own demand).
    origin: String,
    lease: Lease,
    renew: Duration,
    budgets: Vec<String>,
    keys: Mutex<HashMap<(usize, String), Entry>>,
    clock: Arc<dyn Clock>,
    /// When the last renewal answered (monotonic µs): a region cut off from the database
    /// longer than a lease holds none for the classes that fail closed.
    renewed_us: std::sync::atomic::AtomicU64,
}

const REPORT: &str = "INSERT INTO region_demand (budget, subject, origin, region, demand, at_ms) \
    SELECT b, s, $3, $4, d, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT \
    FROM UNNEST($1::TEXT[], $2::TEXT[], $5::FLOAT8[]) AS t(b, s, d) \
    ON CONFLICT (budget, subject, origin) DO UPDATE \
    SET demand = excluded.demand, at_ms = excluded.at_ms, region = excluded.region";

const READ: &str = "SELECT budget, subject, region, demand, at_ms, \
    (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT \
    FROM region_demand WHERE (budget, subject) IN (SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[]))";

const PRUNE: &str = "DELETE FROM region_demand \
    WHERE at_ms < (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT - $1";

impl Shares {
    /// The shares of `budgets` for an instance of `region` (`instance` tells it from the
    /// region's other instances).
    pub fn new(
        pool: PgPool,
        region: &str,
        instance: &str,
        regions: u32,
        renew_ms: u64,
        budgets: Vec<String>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            pool,
            region: region.to_owned(),
            origin: format!("{region}/{instance}"),
            lease: Lease::new(regions, renew_ms),
            renew: Duration::from_millis(renew_ms),
            budgets,
            keys: Mutex::default(),
            renewed_us: std::sync::atomic::AtomicU64::new(clock.monotonic_us()),
            clock,
        }
    }

    /// Reports this instance's demand for the keys it used and sizes their shares from every
    /// region's reports; keys idle since are dropped. Returns how many keys hold a lease.
    pub async fn renew(&self) -> Result<usize, sqlx::Error> {
        let (budgets, subjects, demands): (Vec<String>, Vec<String>, Vec<f64>) = {
            let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
            keys.retain(|_, e| e.period > 0.0 || e.reported.is_some_and(|d| d >= IDLE));
            let mut out = (Vec::new(), Vec::new(), Vec::new());
            for ((budget, subject), entry) in keys.iter_mut() {
                let demand = smooth(entry.reported, entry.period);
                entry.reported = Some(demand);
                entry.period = 0.0;
                out.0.push(self.budgets[*budget].clone());
                out.1.push(subject.clone());
                out.2.push(demand);
            }
            out
        };
        if budgets.is_empty() {
            // Nothing to renew: no lease to lose either.
            self.renewed();
            metrics::gauge!(names::REGION_LEASED_KEYS).set(0.0);
            return Ok(0);
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query(REPORT)
            .bind(&budgets)
            .bind(&subjects)
            .bind(&self.origin)
            .bind(&self.region)
            .bind(&demands)
            .execute(&mut *tx)
            .await?;
        let rows: Vec<(String, String, String, f64, i64, i64)> = sqlx::query_as(READ)
            .bind(&budgets)
            .bind(&subjects)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        self.renewed();
        let mut reports: HashMap<(&str, &str), Vec<Report<'_>>> = HashMap::new();
        let mut now_ms = 0;
        for (budget, subject, region, demand, at_ms, now) in &rows {
            now_ms = *now;
            reports
                .entry((budget.as_str(), subject.as_str()))
                .or_default()
                .push(Report {
                    region: region.as_str(),
                    demand: *demand,
                    at_ms: *at_ms,
                });
        }
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        for ((budget, subject), entry) in keys.iter_mut() {
            if let Some(reports) = reports.get(&(self.budgets[*budget].as_str(), subject.as_str()))
            {
                let target = self.lease.share(
                    &self.region,
                    reports,
                    now_ms,
                    entry.budget,
                    !entry.fails_closed,
                );
                entry.share = Some(step(entry.share, target, self.lease.unleased()));
            }
        }
        let leased = keys.len();
        metrics::gauge!(names::REGION_LEASED_KEYS).set(leased as f64);
        Ok(leased)
    }

    fn renewed(&self) {
        self.renewed_us.store(
            self.clock.monotonic_us(),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// Deletes reports older than two open leases (keys no region uses any more; a report
    /// counts for at most one, [`Lease::open_lease_ms`]).
    pub async fn prune(&self) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(PRUNE)
            .bind(self.lease.open_lease_ms.saturating_mul(2))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// Renews every `regions.renew_ms` until `shutdown` fires; a renewal that fails keeps
    /// the shares leased before (a region cut off keeps its last lease).
    pub fn spawn(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.renew);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut renewals = 0u64;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = shutdown.changed() => return,
                }
                if let Err(error) = self.renew().await {
                    tracing::warn!(error.cause = %error, "renewing the global budgets' shares failed; the last leases stand");
                }
                renewals += 1;
                if renewals.is_multiple_of(240)
                    && let Err(error) = self.prune().await
                {
                    tracing::debug!(error.cause = %error, "pruning old demand reports failed");
                }
            }
        });
    }
}

impl crate::limiter::GlobalShares for Shares {
    fn global(&self, budget: &str) -> Option<usize> {
        self.budgets.iter().position(|b| b == budget)
    }

    /// At least [`MIN_SHARE`]; a key never leased gets the fair slice.
    fn share(
        &self,
        global: usize,
        subject: &str,
        cost: u32,
        refill_per_s: f64,
        fails_closed: bool,
    ) -> f64 {
        let cut_off = fails_closed && {
            let renewed = self.renewed_us.load(std::sync::atomic::Ordering::Acquire);
            let lease_us = u64::try_from(self.lease.lease_ms).unwrap_or(0) * 1000;
            self.clock.monotonic_us().saturating_sub(renewed) > lease_us
        };
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = match keys.get_mut(&(global, subject.to_owned())) {
            Some(entry) => entry,
            None => keys.entry((global, subject.to_owned())).or_default(),
        };
        entry.period += f64::from(cost);
        entry.budget = refill_per_s * self.renew.as_secs_f64();
        entry.fails_closed = fails_closed;
        if cut_off {
            return MIN_SHARE;
        }
        entry
            .share
            .unwrap_or_else(|| self.lease.unleased())
            .max(MIN_SHARE)
    }
}
