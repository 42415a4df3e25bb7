//! Several regions, each with its own hot store and instances, sharing one Postgres
//! (`[regions]`; docs/MULTI-REGION.md).
//!
//! - [`changes`]: lockouts, releases, list entries and stored factors written in another
//!   region reach this region's hot store (Postgres `NOTIFY`, and a full reconcile after any
//!   gap).
//! - [`shares`] and [`lease`]: the global budgets hold across regions by leased shares.
//!
//! Policies need nothing here: every instance reads the promoted policy from the database
//! each second (`policy::canary`).

pub mod changes;
pub mod lease;
pub mod shares;

use std::sync::Arc;

/// What this instance shares with the other regions (nothing in a single region).
#[derive(Debug, Default)]
pub struct Regions {
    /// Other regions' changes, applied here.
    pub changes: Option<Arc<changes::Changes>>,
    /// Leased shares of the global budgets (also held by the limiter).
    pub shares: Option<Arc<shares::Shares>>,
}

impl Regions {
    /// Starts listening and renewing until `shutdown` fires.
    pub fn spawn(&self, shutdown: &tokio::sync::watch::Receiver<bool>) {
        if let Some(changes) = &self.changes {
            changes.clone().spawn(shutdown.clone());
        }
        if let Some(shares) = &self.shares {
            shares.clone().spawn(shutdown.clone());
        }
    }
}
