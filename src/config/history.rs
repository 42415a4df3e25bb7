//! `[history]`: the decision history analysts read ("why was this request refused then?").

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// What is kept of refused and challenged limit checks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistorySettings {
    /// Days a decision stays in the history; 0 keeps none (the history is off).
    ///
    /// TOML `history.retention_days`, env `PALISADE_HISTORY__RETENTION_DAYS`; default 7.
    pub retention_days: u32,
    /// Seconds over which the refusals of one key by one budget are counted into one entry
    /// (an attack's thousands of 429s a second are one row per key and window).
    ///
    /// TOML `history.window_s`, env `PALISADE_HISTORY__WINDOW_S`; default 10 (1–300).
    pub window_s: u64,
    /// Most distinct entries one instance holds within a window; the rest are counted in
    /// `palisade_history_dropped_total` and not kept.
    ///
    /// TOML `history.max_pending`, env `PALISADE_HISTORY__MAX_PENDING`; default 10000.
    pub max_pending: usize,
}

impl Default for HistorySettings {
    fn default() -> Self {
        Self {
            retention_days: 7,
            window_s: 10,
            max_pending: 10_000,
        }
    }
}

impl HistorySettings {
    pub(super) fn validate(&self) -> Result<(), SettingError> {
        if !(1..=300).contains(&self.window_s) {
            return Err(SettingError::new(
                setting_name("history.window_s"),
                "must be 1-300 (seconds)",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_pending) {
            return Err(SettingError::new(
                setting_name("history.max_pending"),
                "must be 1-1000000",
            ));
        }
        if self.retention_days > 3650 {
            return Err(SettingError::new(
                setting_name("history.retention_days"),
                "must be 0-3650 (days; 0 keeps no history)",
            ));
        }
        Ok(())
    }

    /// Whether decisions are kept at all.
    pub fn enabled(&self) -> bool {
        self.retention_days > 0
    }
}
