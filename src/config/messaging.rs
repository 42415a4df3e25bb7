//! `[messaging]`: how recipients of messages and notifications are made canonical, for the
//! `recipient` and `destination` budget scopes (`messaging::Recipient`).

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// Recipients of OTPs, messages and push notifications.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MessagingSettings {
    /// The region of phone numbers written without a country code (`07700 900123`), as an
    /// ISO 3166 code such as `GB` or `US`. Empty: such numbers are refused (400), and only
    /// international ones (`+44…`, `0044…` is national-prefix dependent) are taken.
    ///
    /// TOML `messaging.default_region`, env `PALISADE_MESSAGING__DEFAULT_REGION`; default
    /// empty.
    pub default_region: String,
    /// Digits of the national number, after the country code, that name a phone number's
    /// destination (`+44 7700 900123` → `+44770` with 3): the `destination` scope's key.
    ///
    /// TOML `messaging.destination_digits`, env `PALISADE_MESSAGING__DESTINATION_DIGITS`;
    /// default 3, 1–8.
    pub destination_digits: u32,
    /// Scales the `destination` budgets of a premium-rate number (libphonenumber's ranges),
    /// where SMS pumping pays: 0.1 allows a tenth.
    ///
    /// TOML `messaging.premium_rate_factor`, env `PALISADE_MESSAGING__PREMIUM_RATE_FACTOR`;
    /// default 0.1, 0–1.
    pub premium_rate_factor: f64,
    /// Each destination's OTP conversion (`[messaging.conversion]`).
    pub conversion: ConversionSettings,
}

/// When a destination's codes stop being verified (SMS pumping): its budgets are tightened
/// until it recovers or an analyst clears it (`messaging::conversion`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConversionSettings {
    /// Length of the windows codes sent and verified are counted in, seconds.
    ///
    /// TOML `messaging.conversion.window_s`, env `PALISADE_MESSAGING__CONVERSION__WINDOW_S`;
    /// default 300, 60–86400.
    pub window_s: u32,
    /// Codes sent in a window for it to be judged (or learned from).
    ///
    /// TOML `messaging.conversion.min_sent`, env `PALISADE_MESSAGING__CONVERSION__MIN_SENT`;
    /// default 20, at least 1.
    pub min_sent: u64,
    /// A window collapses below this share of the destination's learned rate.
    ///
    /// TOML `messaging.conversion.collapse_ratio`, env
    /// `PALISADE_MESSAGING__CONVERSION__COLLAPSE_RATIO`; default 0.5, 0–1.
    pub collapse_ratio: f64,
    /// Before a destination's rate is learned (three busy windows), a window collapses below
    /// this rate.
    ///
    /// TOML `messaging.conversion.floor_rate`, env
    /// `PALISADE_MESSAGING__CONVERSION__FLOOR_RATE`; default 0.25, 0–1.
    pub floor_rate: f64,
    /// The destination's multiplier on `messaging` after a collapse.
    ///
    /// TOML `messaging.conversion.factor`, env `PALISADE_MESSAGING__CONVERSION__FACTOR`;
    /// default 0.1, 0–1.
    pub factor: f64,
    /// How long that lasts, seconds (a later collapse renews it).
    ///
    /// TOML `messaging.conversion.hold_s`, env `PALISADE_MESSAGING__CONVERSION__HOLD_S`;
    /// default 3600, 60–604800.
    pub hold_s: u64,
}

impl Default for ConversionSettings {
    fn default() -> Self {
        Self {
            window_s: 300,
            min_sent: 20,
            collapse_ratio: 0.5,
            floor_rate: 0.25,
            factor: 0.1,
            hold_s: 3600,
        }
    }
}

impl Default for MessagingSettings {
    fn default() -> Self {
        Self {
            default_region: String::new(),
            destination_digits: 3,
            premium_rate_factor: 0.1,
            conversion: ConversionSettings::default(),
        }
    }
}

impl MessagingSettings {
    /// The parsed `default_region` (None when empty).
    pub fn default_region(&self) -> Result<Option<phonenumber::country::Id>, String> {
        if self.default_region.is_empty() {
            return Ok(None);
        }
        self.default_region
            .to_ascii_uppercase()
            .parse()
            .map(Some)
            .map_err(|_| {
                format!(
                    "messaging.default_region {:?} is not a region code",
                    self.default_region
                )
            })
    }

    pub(super) fn validate(&self) -> Result<(), SettingError> {
        if let Err(err) = self.default_region() {
            return Err(SettingError::new(
                setting_name("messaging.default_region"),
                format!("{err} (an ISO 3166 code such as GB or US)"),
            ));
        }
        if !(1..=8).contains(&self.destination_digits) {
            return Err(SettingError::new(
                setting_name("messaging.destination_digits"),
                "must be between 1 and 8",
            ));
        }
        let conversion = &self.conversion;
        for (name, value) in [
            ("messaging.premium_rate_factor", self.premium_rate_factor),
            (
                "messaging.conversion.collapse_ratio",
                conversion.collapse_ratio,
            ),
            ("messaging.conversion.floor_rate", conversion.floor_rate),
            ("messaging.conversion.factor", conversion.factor),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(SettingError::new(
                    setting_name(name),
                    "must be between 0 and 1",
                ));
            }
        }
        if !(60..=86_400).contains(&conversion.window_s) {
            return Err(SettingError::new(
                setting_name("messaging.conversion.window_s"),
                "must be between 60 and 86400",
            ));
        }
        if conversion.min_sent == 0 {
            return Err(SettingError::new(
                setting_name("messaging.conversion.min_sent"),
                "must be at least 1",
            ));
        }
        if !(60..=604_800).contains(&conversion.hold_s) {
            return Err(SettingError::new(
                setting_name("messaging.conversion.hold_s"),
                "must be between 60 and 604800",
            ));
        }
        Ok(())
    }
}
