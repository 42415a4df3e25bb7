//! What attestation tells the rest of the service: the `unverified` pull signal for devices
//! without a valid verdict, and attested devices as a known context for the lockout-DoS rule.

use std::sync::Arc;

use super::{Attestation, SIGNAL};
use crate::clock::Clock;
use crate::model::{SubjectKey, SubjectKind};
use crate::scoring::{Engine, Factor, Signal, Subject};

use std::borrow::Cow;

impl Attestation {
    /// The pull signal giving devices without a verdict the `unverified` factor.
    pub fn unverified_signal(&self) -> UnverifiedSignal {
        UnverifiedSignal {
            unverified: Factor::scale(
                SIGNAL,
                "attestation_unverified",
                self.settings.factor("unverified", false),
                "no valid attestation for this device",
            )
            .with_class_value(
                &self.public_classes,
                self.settings.factor("unverified", true),
            ),
        }
    }

    /// Which devices count as attested (a fresh verdict of device integrity or better), for
    /// the lockout-DoS rule.
    pub fn attested_devices(&self) -> AttestedDevices {
        AttestedDevices {
            scoring: self.scoring.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// Devices holding an unexpired `strong` or `device` verdict (read from the device's stored
/// factors, which every instance shares): a known context for the lockout-DoS rule.
#[derive(Debug)]
pub struct AttestedDevices {
    scoring: Arc<Engine>,
    clock: Arc<dyn Clock>,
}

impl AttestedDevices {
    async fn check(&self, device: &SubjectKey) -> Result<bool, crate::store::Error> {
        {
            let now = self.clock.now_ms();
            let factors = self.scoring.stored(device).await.map_err(|err| match err {
                crate::scoring::Error::Store(store) => store,
            })?;
            Ok(factors.iter().any(|f| {
                f.signal == SIGNAL
                    && matches!(f.code.as_str(), "attestation_strong" | "attestation_device")
                    && f.expires_at_ms.is_none_or(|at| at > now)
            }))
        }
    }
}

impl crate::lockout::AttestedDevices for AttestedDevices {
    fn is_attested<'a>(
        &'a self,
        device: &'a SubjectKey,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>> {
        Box::pin(self.check(device))
    }
}

impl crate::limiter::AttestedDevices for AttestedDevices {
    fn is_attested<'a>(
        &'a self,
        device: &'a SubjectKey,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>> {
        Box::pin(self.check(device))
    }
}

/// Devices without a valid verdict are `unverified` (a pull signal: no write per device).
#[derive(Debug)]
pub struct UnverifiedSignal {
    /// The one factor it gives (the same for every unverified device: built once).
    unverified: Factor,
}

impl Signal for UnverifiedSignal {
    fn name(&self) -> &'static str {
        SIGNAL
    }

    fn factors(&self, subject: &Subject<'_>, stored: &[Factor], now_ms: i64) -> Vec<Factor> {
        if stored.iter().any(|f| f.signal == SIGNAL) {
            return Vec::new();
        }
        self.defaults(subject, now_ms).into_owned()
    }

    fn defaults(&self, subject: &Subject<'_>, _now_ms: i64) -> Cow<'_, [Factor]> {
        if subject.key.kind() == SubjectKind::Device {
            Cow::Borrowed(std::slice::from_ref(&self.unverified))
        } else {
            Cow::Borrowed(&[])
        }
    }
}
