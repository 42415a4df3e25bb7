//! Repeat offenders: keys that keep hitting 429, counted in a bounded heavy-hitter sketch.
//!
//! Each instance counts 429s per key in a Space-Saving sketch (Metwally et al. 2005) of fixed
//! capacity: a new key beyond capacity replaces the smallest counter and inherits its count
//! as its error, so every key with more than `total / capacity` hits is kept, with an
//! overestimate of at most its `error`. Every flush (about a second) each instance adds its
//! guaranteed counts (`count − error`) to shared per-minute totals in the hot store; a key
//! whose minute total passes the threshold is a repeat offender. Written by hand: the
//! algorithm is twenty lines, and none of the crates offering it is widely used.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// A Space-Saving sketch over key texts.
#[derive(Debug)]
pub struct SpaceSaving {
    capacity: usize,
    counters: HashMap<Arc<str>, (u64, u64)>,
    /// `(count, key)`, to find the smallest counter.
    order: BTreeSet<(u64, Arc<str>)>,
}

impl SpaceSaving {
    /// A sketch of at most `capacity` counters.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            counters: HashMap::new(),
            order: BTreeSet::new(),
        }
    }

    /// Counts `n` hits of `key`.
    pub fn offer(&mut self, key: &str, n: u64) {
        if let Some((key, (count, error))) = self
            .counters
            .get_key_value(key)
            .map(|(k, v)| (k.clone(), *v))
        {
            self.order.remove(&(count, key.clone()));
            self.order.insert((count + n, key.clone()));
            self.counters.insert(key, (count + n, error));
            return;
        }
        let key: Arc<str> = Arc::from(key);
        if self.counters.len() < self.capacity {
            self.counters.insert(key.clone(), (n, 0));
            self.order.insert((n, key));
            return;
        }
        let Some((min, evicted)) = self.order.pop_first() else {
            return;
        };
        self.counters.remove(&evicted);
        self.counters.insert(key.clone(), (min + n, min));
        self.order.insert((min + n, key));
    }

    /// Counters held (never more than the capacity).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// True when nothing was counted since the last drain.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// Every counter `(key, count, error)`, largest first, and an empty sketch.
    pub fn drain(&mut self) -> Vec<(Arc<str>, u64, u64)> {
        self.order.clear();
        let mut all: Vec<(Arc<str>, u64, u64)> = self
            .counters
            .drain()
            .map(|(key, (count, error))| (key, count, error))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_hitters_survive_a_flood_of_one_off_keys_within_the_capacity() {
        let mut sketch = SpaceSaving::new(64);
        for round in 0..200u64 {
            sketch.offer("ip:203.0.113.9", 1);
            for other in 0..20 {
                sketch.offer(&format!("ip:10.{round}.{other}.1"), 1);
            }
        }
        assert!(sketch.len() <= 64);
        let top = sketch.drain();
        let (key, count, error) = &top[0];
        assert_eq!(&**key, "ip:203.0.113.9");
        assert!(count - error <= 200 && *count >= 200, "{count} - {error}");
        // 4200 hits over 64 counters: the error is at most total / capacity.
        assert!(*error <= 4200 / 64, "{error}");
        assert!(sketch.is_empty());
    }

    #[test]
    fn exact_while_under_capacity() {
        let mut sketch = SpaceSaving::new(8);
        sketch.offer("a", 3);
        sketch.offer("b", 1);
        sketch.offer("a", 2);
        let top = sketch.drain();
        assert_eq!(top[0], (Arc::from("a"), 5, 0));
        assert_eq!(top[1], (Arc::from("b"), 1, 0));
    }
}
