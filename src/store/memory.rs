//! The in-process hot store (embedded mode): same semantics as Redis, one process.

/// In-process buckets, counters and multipliers.
#[derive(Debug, Clone, Default)]
pub struct MemoryHot {}

impl MemoryHot {
    /// An empty store.
    pub fn new() -> Self {
        Self {}
    }
}
