//! `[record]`: the traffic record that `palisade replay` runs candidate policies against.

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// What is recorded of limit checks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecordSettings {
    /// Record the inputs of limit checks (method, endpoint, client, user and device as keyed
    /// pseudonyms, cost) for `palisade replay`. Needs `privacy.pseudonym_key`.
    ///
    /// TOML `record.enabled`, env `PALISADE_RECORD__ENABLED`; default false.
    pub enabled: bool,
    /// Share of clients recorded, 0–1: a client (its user, else its address) is recorded
    /// whole or not at all, so its buckets replay as they ran.
    ///
    /// TOML `record.sample`, env `PALISADE_RECORD__SAMPLE`; default 1.
    pub sample: f64,
    /// Hours a recorded check is kept.
    ///
    /// TOML `record.retention_hours`, env `PALISADE_RECORD__RETENTION_HOURS`; default 24.
    pub retention_hours: u64,
    /// Most checks one instance holds before writing them (each second); the rest are
    /// counted in `palisade_record_dropped_total`.
    ///
    /// TOML `record.max_buffered`, env `PALISADE_RECORD__MAX_BUFFERED`; default 200000.
    pub max_buffered: usize,
}

impl Default for RecordSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            sample: 1.0,
            retention_hours: 24,
            max_buffered: 200_000,
        }
    }
}

impl RecordSettings {
    pub(super) fn validate(&self, has_key: bool) -> Result<(), SettingError> {
        if !(0.0..=1.0).contains(&self.sample) {
            return Err(SettingError::new(
                setting_name("record.sample"),
                "must be between 0 and 1",
            ));
        }
        if self.retention_hours == 0 || self.retention_hours > 24 * 90 {
            return Err(SettingError::new(
                setting_name("record.retention_hours"),
                "must be 1-2160 (hours)",
            ));
        }
        if self.max_buffered == 0 {
            return Err(SettingError::new(
                setting_name("record.max_buffered"),
                "must be at least 1",
            ));
        }
        if self.enabled && !has_key {
            return Err(SettingError::new(
                setting_name("record.enabled"),
                "needs privacy.pseudonym_key: recorded users, devices and addresses are keyed pseudonyms",
            ));
        }
        Ok(())
    }
}
