//! `[privacy]`: pseudonyms for identifiers leaving the service (logs, webhooks, the audit
//! entry of an erasure).

use serde::{Deserialize, Serialize};

use super::{Secret, SettingError, setting_name};

/// How identifiers are shown outside the API.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrivacySettings {
    /// The key of pseudonyms: `anon-` and 16 hex digits of HMAC-SHA256(key, identifier), the
    /// same for the same identifier, unlinkable without the key.
    ///
    /// TOML `privacy.pseudonym_key`, env `PALISADE_PRIVACY__PSEUDONYM_KEY`; default unset (an
    /// erasure's audit entry then names a random pseudonym). At least 32 characters.
    pub pseudonym_key: Option<Secret>,
    /// Alert webhooks (and logs, whatever `clear_logs` says) name accounts, devices and
    /// addresses by pseudonym; the API (analysts, the console) still shows them in clear.
    /// Needs `pseudonym_key`.
    ///
    /// TOML `privacy.pseudonymize`, env `PALISADE_PRIVACY__PSEUDONYMIZE`; default false.
    pub pseudonymize: bool,
    /// Logs name accounts, devices and addresses in clear. By default they show pseudonyms:
    /// keyed by `pseudonym_key` (stable across restarts and instances), or without one by a
    /// key made at start (linking the lines of one run only).
    ///
    /// TOML `privacy.clear_logs`, env `PALISADE_PRIVACY__CLEAR_LOGS`; default false.
    pub clear_logs: bool,
}

impl PrivacySettings {
    pub(super) fn validate(&self) -> Result<(), SettingError> {
        if self
            .pseudonym_key
            .as_ref()
            .is_some_and(|key| key.expose().len() < 32)
        {
            return Err(SettingError::new(
                setting_name("privacy.pseudonym_key"),
                "must be at least 32 characters (e.g. openssl rand -hex 32)",
            ));
        }
        if self.pseudonymize && self.pseudonym_key.is_none() {
            return Err(SettingError::new(
                setting_name("privacy.pseudonymize"),
                "needs privacy.pseudonym_key (PALISADE_PRIVACY__PSEUDONYM_KEY)",
            ));
        }
        Ok(())
    }
}
