//! The service's normal count of failures from unknown contexts, learned per hour of the
//! day: what the guard compares a window with once it is known.

/// Windows a baseline of one hour of the day must have seen before it is trusted.
pub(super) const BASELINE_SAMPLES: u32 = 3;

/// The service's normal count of failures from unknown contexts in one window, per hour of
/// the day (UTC): a moving average of the windows judged while the guard was off. With
/// Redis it is kept there too (JSON), so an instance that starts takes what the others
/// learned.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct Baseline {
    /// Per hour: the normal, how many windows it has seen, and the first of them.
    hours: [Hour; 24],
    /// The last window sampled (Unix ms ÷ window length).
    pub(super) sampled: i64,
}

/// What one hour of the day has learned.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
struct Hour {
    normal: f64,
    samples: u32,
    first: [f64; BASELINE_SAMPLES as usize],
}

impl Baseline {
    /// True before any window was learned (an instance that just started).
    pub(super) fn is_empty(&self) -> bool {
        self.hours.iter().all(|h| h.samples == 0)
    }

    /// Takes `shared` (what the instances learned, read from the hot store) when this one
    /// has learned nothing yet or `shared` has seen a later window.
    pub(super) fn adopt(&mut self, shared: Baseline) {
        if !shared.is_empty() && (self.is_empty() || shared.sampled > self.sampled) {
            *self = shared;
        }
    }

    /// The learned normal for the hour of `now_ms`, once it has seen enough windows.
    pub(super) fn normal(&self, now_ms: i64) -> Option<f64> {
        let hour = &self.hours[hour(now_ms)];
        (hour.samples >= BASELINE_SAMPLES).then_some(hour.normal)
    }

    /// Learns the window before `window` (its count `unknown`) once, if it was `quiet`. The
    /// first windows of an hour set the normal to their median (a large service learns its
    /// own normal at once, and the window an attack began in is not it); later ones move it
    /// a fifth of the way and count for at most 1.5 times it, so failures kept just under
    /// the threshold raise it slowly (a tenth a window at most).
    pub(super) fn learn(&mut self, window: i64, unknown: u64, now_ms: i64, quiet: bool) {
        if window <= self.sampled {
            return;
        }
        // Windows no login was judged in had none.
        let empty = (window - self.sampled - 1).clamp(0, i64::from(BASELINE_SAMPLES));
        self.sampled = window;
        let hour = &mut self.hours[hour(now_ms)];
        for _ in 0..empty {
            hour.learn(0.0);
        }
        if quiet {
            #[allow(clippy::cast_precision_loss)] // counts far below 2^52
            hour.learn(unknown as f64);
        }
    }
}

impl Hour {
    fn learn(&mut self, sample: f64) {
        if let Some(slot) = self.first.get_mut(self.samples as usize) {
            *slot = sample;
            if self.samples + 1 == BASELINE_SAMPLES {
                let mut first = self.first;
                first.sort_by(f64::total_cmp);
                self.normal = first[first.len() / 2];
            }
        } else {
            let sample = sample.min(self.normal.max(1.0) * 1.5);
            self.normal += (sample - self.normal) / 5.0;
        }
        self.samples = self.samples.saturating_add(1);
    }
}

fn hour(now_ms: i64) -> usize {
    usize::try_from(now_ms.div_euclid(3_600_000).rem_euclid(24)).unwrap_or(0)
}
