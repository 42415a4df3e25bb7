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
}

impl Default for MessagingSettings {
    fn default() -> Self {
        Self {
            default_region: String::new(),
            destination_digits: 3,
            premium_rate_factor: 0.1,
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
        if !(0.0..=1.0).contains(&self.premium_rate_factor) {
            return Err(SettingError::new(
                setting_name("messaging.premium_rate_factor"),
                "must be between 0 and 1",
            ));
        }
        Ok(())
    }
}
