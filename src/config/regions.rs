//! `[regions]`: several regions, each with its own hot store and instances, sharing one
//! Postgres (`regions` module; docs/MULTI-REGION.md).

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// This instance's region and the budgets every region shares.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegionSettings {
    /// This instance's region (letters, digits, `-`, `_`; up to 32). Empty: one region, and
    /// nothing is shared beyond the hot store. Set, the database must be Postgres and the hot
    /// store Redis: lockouts, releases, list entries and stored factors made in another
    /// region reach this region's hot store within a second, and the `global_budgets` hold
    /// across regions by leased shares.
    ///
    /// TOML `regions.name`, env `PALISADE_REGIONS__NAME`; default empty.
    pub name: String,
    /// How many regions share the database: a key no region has leased yet gets 1/count of
    /// a global budget in each.
    ///
    /// TOML `regions.count`, env `PALISADE_REGIONS__COUNT`; default 1, 1–16.
    pub count: u32,
    /// Budgets held across regions (names in `[[limits.budgets]]`): each region spends a
    /// share of each key's budget, leased from its recent demand (what no region asks for
    /// is divided equally; a budget asked beyond its rate, in proportion). Typical:
    /// `auth-account` (an account's logins) and tenant quotas. The other budgets are each
    /// region's own.
    ///
    /// TOML `regions.global_budgets`, env `PALISADE_REGIONS__GLOBAL_BUDGETS` (comma
    /// separated); default empty.
    #[serde(deserialize_with = "super::integrations::one_or_many")]
    pub global_budgets: Vec<String>,
    /// How often a region reports its demand for the global budgets' keys and renews its
    /// shares, milliseconds.
    ///
    /// TOML `regions.renew_ms`, env `PALISADE_REGIONS__RENEW_MS`; default 250, 50–10000.
    pub renew_ms: u64,
}

impl Default for RegionSettings {
    fn default() -> Self {
        Self {
            name: String::new(),
            count: 1,
            global_budgets: Vec::new(),
            renew_ms: 250,
        }
    }
}

impl RegionSettings {
    /// True when this instance is one of several regions.
    pub fn enabled(&self) -> bool {
        !self.name.is_empty()
    }

    pub(super) fn validate(
        &self,
        budgets: &[&str],
        postgres: bool,
        redis: bool,
    ) -> Result<(), SettingError> {
        if !self.enabled() {
            return Ok(());
        }
        if self.name.len() > 32
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(SettingError::new(
                setting_name("regions.name"),
                "must be up to 32 letters, digits, '-' or '_'",
            ));
        }
        if !(postgres && redis) {
            return Err(SettingError::new(
                setting_name("regions.name"),
                "regions share a Postgres database and each has its own Redis: set database_url to postgres://… and redis_url",
            ));
        }
        if !(1..=16).contains(&self.count) {
            return Err(SettingError::new(
                setting_name("regions.count"),
                "must be between 1 and 16",
            ));
        }
        if !(50..=10_000).contains(&self.renew_ms) {
            return Err(SettingError::new(
                setting_name("regions.renew_ms"),
                "must be between 50 and 10000",
            ));
        }
        if let Some(unknown) = self
            .global_budgets
            .iter()
            .find(|name| !budgets.contains(&name.as_str()))
        {
            return Err(SettingError::new(
                setting_name("regions.global_budgets"),
                format!("{unknown:?} is not a budget in [[limits.budgets]]"),
            ));
        }
        Ok(())
    }
}
