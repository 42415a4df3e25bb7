//! The conversion of each destination: of the codes sent there, how many were verified.
//!
//! Honest users verify most codes they ask for; SMS pumping verifies none (nobody reads the
//! premium-rate numbers' messages). Per destination, codes sent and verified are counted in
//! fixed windows of `messaging.conversion.window_s`. A window that closed with at least
//! `min_sent` codes sent teaches the destination its normal rate (the first three windows'
//! median, then a moving average); a closed window whose rate fell below
//! `collapse_ratio` × that normal — or, before it is learned, below `floor_rate` — is a
//! **collapse**: the caller tightens the destination and raises an alert once.
//!
//! Counts live in this process (each instance judges the events it ingests, which behind a
//! load balancer is a fair sample of the rate); an instance that starts counts the stored
//! deliveries of the last day first (`Messaging::replay`).

use std::collections::HashMap;

use crate::config::ConversionSettings;

/// What one destination's windows say.
#[derive(Debug, Clone, Default, PartialEq)]
struct Destination {
    /// Start of the window being counted, ms.
    window_start_ms: i64,
    sent: u64,
    verified: u64,
    /// Rates of the first busy windows, until three are seen.
    first: Vec<f64>,
    /// The learned normal rate.
    normal: Option<f64>,
}

/// A closed window whose conversion collapsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Collapse {
    /// `destination:…` text.
    pub destination: String,
    /// Codes sent in the window.
    pub sent: u64,
    /// Codes verified in it.
    pub verified: u64,
    /// The rate it was held to (learned normal × ratio, or the floor).
    pub threshold: f64,
    /// Whether the threshold came from the destination's own history.
    pub learned: bool,
}

/// Per-destination windows.
#[derive(Debug, Default)]
pub struct Conversion {
    destinations: std::sync::Mutex<HashMap<String, Destination>>,
}

/// The kind of a delivery event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A code was sent.
    Sent,
    /// A code was entered correctly.
    Verified,
}

impl Conversion {
    /// Counts one event at `ts_ms` for `destination`; returns the collapse of the window it
    /// closed, if any.
    pub fn record(
        &self,
        settings: &ConversionSettings,
        destination: &str,
        outcome: Outcome,
        ts_ms: i64,
    ) -> Option<Collapse> {
        let window_ms = i64::from(settings.window_s) * 1000;
        let start = ts_ms.div_euclid(window_ms) * window_ms;
        let mut all = self
            .destinations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let state = all
            .entry(destination.to_owned())
            .or_insert_with(|| Destination {
                window_start_ms: start,
                ..Destination::default()
            });
        let mut collapse = None;
        // An event of a window already closed (a late report) counts in the current one.
        if start > state.window_start_ms {
            collapse = close(settings, destination, state);
            state.window_start_ms = start;
            state.sent = 0;
            state.verified = 0;
        }
        match outcome {
            Outcome::Sent => state.sent += 1,
            Outcome::Verified => state.verified += 1,
        }
        collapse
    }

    /// The learned normal rate of `destination`, if any.
    pub fn normal(&self, destination: &str) -> Option<f64> {
        self.destinations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(destination)
            .and_then(|d| d.normal)
    }
}

/// Judges the closed window of `state` and learns from it.
fn close(
    settings: &ConversionSettings,
    destination: &str,
    state: &mut Destination,
) -> Option<Collapse> {
    if state.sent < settings.min_sent {
        return None;
    }
    // Codes verified from an earlier window's sends can exceed this window's.
    let rate = (state.verified as f64 / state.sent as f64).min(1.0);
    let (threshold, learned) = match state.normal {
        Some(normal) => (normal * settings.collapse_ratio, true),
        None => (settings.floor_rate, false),
    };
    if rate < threshold {
        // A collapsed window teaches nothing: the normal stays the honest one.
        return Some(Collapse {
            destination: destination.to_owned(),
            sent: state.sent,
            verified: state.verified,
            threshold,
            learned,
        });
    }
    match state.normal {
        Some(normal) => state.normal = Some(normal * 0.8 + rate * 0.2),
        None => {
            state.first.push(rate);
            if state.first.len() == 3 {
                let mut first = std::mem::take(&mut state.first);
                first.sort_by(f64::total_cmp);
                state.normal = Some(first[1]);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ConversionSettings {
        ConversionSettings {
            window_s: 600,
            min_sent: 20,
            ..ConversionSettings::default()
        }
    }

    /// Sends `sent` codes in the window starting at `window` (× 600 s), `verified` of them
    /// verified; returns what closing the previous window said.
    fn window(c: &Conversion, window: i64, sent: u64, verified: u64) -> Vec<Collapse> {
        let s = settings();
        let mut out = Vec::new();
        let base = window * 600_000;
        for i in 0..sent {
            out.extend(c.record(&s, "destination:+44909", Outcome::Sent, base + i as i64));
        }
        for i in 0..verified {
            out.extend(c.record(
                &s,
                "destination:+44909",
                Outcome::Verified,
                base + 1_000 + i as i64,
            ));
        }
        out
    }

    #[test]
    fn a_destination_learns_its_normal_and_a_collapse_is_judged_against_it() {
        let c = Conversion::default();
        // Three honest windows: 80 %, 70 %, 90 % → normal 80 %.
        window(&c, 0, 50, 40);
        window(&c, 1, 50, 35);
        window(&c, 2, 50, 45);
        assert!(window(&c, 3, 50, 38).is_empty());
        assert_eq!(c.normal("destination:+44909"), Some(0.8));
        // 30 % is fine against the floor (25 %) but a collapse against half of 80 %.
        window(&c, 4, 100, 30);
        let collapse = window(&c, 5, 1, 1);
        assert_eq!(collapse.len(), 1, "{collapse:?}");
        assert_eq!((collapse[0].sent, collapse[0].verified), (100, 30));
        assert!(collapse[0].learned);
        assert!((collapse[0].threshold - 0.4).abs() < 0.05, "{collapse:?}");
        // The collapsed window did not move the normal.
        assert!((c.normal("destination:+44909").unwrap() - 0.8).abs() < 0.05);
    }

    #[test]
    fn before_learning_the_floor_decides_and_quiet_windows_say_nothing() {
        let c = Conversion::default();
        window(&c, 0, 200, 2);
        let collapse = window(&c, 1, 5, 5);
        assert_eq!(collapse.len(), 1);
        assert!(!collapse[0].learned);
        // Five sends, none verified: too few to judge.
        assert!(window(&c, 2, 0, 0).is_empty());
        assert!(window(&c, 3, 1, 0).is_empty());
    }
}
